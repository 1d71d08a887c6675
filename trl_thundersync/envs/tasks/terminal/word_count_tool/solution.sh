cat > wc.py <<'PY'
"""Count lines, words and characters of a UTF-8 file, like wc -l -w -m."""

import json
import sys


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: wc.py FILE", file=sys.stderr)
        return 1
    try:
        with open(sys.argv[1], encoding="utf-8", newline="") as handle:
            text = handle.read()
    except OSError as exc:
        print(f"wc.py: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"lines": text.count("\n"), "words": len(text.split()), "chars": len(text)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
PY
