"""Moved to `trl_thundersync.tiny.model`; kept so imports and `python -m trl_thundersync.testing.tiny` still work."""

from ..tiny.model import build_tiny_model, build_tiny_tokenizer, main, save_model_folder, save_tiny_model

__all__ = ["build_tiny_model", "build_tiny_tokenizer", "main", "save_model_folder", "save_tiny_model"]

if __name__ == "__main__":
    main()
