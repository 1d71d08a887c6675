"""Code the example scripts share (`examples/*.py`), not the trainer API: their flags, their plumbing (CPU defaults,
the offline tiny models), their end-of-run reports.

- `arguments.py`: `SuiteArguments` (`--suite`, `--num_tasks`, `--tiny_model_dir`, `--swe_rows`), the length-shaping
  reward and its flag, held-out evaluation flags, the distillation examples' teacher folder.
- `plumbing.py`: `set_script_defaults`, `resolve_model` / `resolve_teacher` (the offline tiny models, built once per
  node), `finish_distributed`.
- `reports.py`: `report_run` (timing summary, trace and timeline files), `report_learning`, and
  `run_learning_example`, the body of the examples that show learning.

It ships in the wheel so that `python examples/x.py` and `accelerate launch examples/x.py` import it the same way
from a checkout or an installed package, whatever the working directory; the task suites are `envs.suites`.
"""
