python3 - <<'PY'
def read(path):
    pairs = {}
    for raw in open(path):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        line = line.removeprefix("export ")
        key, _, value = line.partition("=")
        pairs[key] = value
    return pairs

merged = read("defaults.env")
merged.update(read("local.env"))  # dicts keep first-insertion order, so defaults come first
with open(".env", "w") as out:
    out.write("".join(f"{key}={value}\n" for key, value in merged.items()))
PY
