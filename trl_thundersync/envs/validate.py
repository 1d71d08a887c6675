"""Moved to `trl_thundersync.envs.suites.validate`: envs/ is split by layer, and this old path keeps working,
also as the documented command:

    python -m trl_thundersync.envs.validate [--suite swe|terminal|lookup|thermostat|all] [--task ID] [--backend local]
"""

from __future__ import annotations

import sys

from .suites.swe import overlay_command
from .suites.validate import ALL, TaskValidation, format_table, main, validate, validate_task

__all__ = ["ALL", "TaskValidation", "format_table", "main", "overlay_command", "validate", "validate_task"]

if __name__ == "__main__":
    sys.exit(main())
