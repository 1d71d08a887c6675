"""Moved to `trl_thundersync.tiny.agent`; kept so imports and `python -m trl_thundersync.testing.tiny_agent` work."""

from ..tiny.agent import main, save_tiny_agent_model, warm_start

__all__ = ["main", "save_tiny_agent_model", "warm_start"]

if __name__ == "__main__":
    main()
