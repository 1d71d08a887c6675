"""Moved to `trl_thundersync.envs.environments.validate`: envs/ is split by layer, and this old path keeps working,
also as the documented command:

    python -m trl_thundersync.envs.validate [--suite swe|terminal|lookup|thermostat|all] [--task ID] [--backend local]
"""

from __future__ import annotations

import sys

from .environments.validate import (
    FULL_REWARD,
    SUITE_CHOICES,
    TaskValidation,
    format_table,
    main,
    overlay_command,
    validate,
    validate_task,
)

__all__ = ["FULL_REWARD", "SUITE_CHOICES", "TaskValidation", "format_table", "main", "overlay_command", "validate",
           "validate_task"]

if __name__ == "__main__":
    sys.exit(main())
