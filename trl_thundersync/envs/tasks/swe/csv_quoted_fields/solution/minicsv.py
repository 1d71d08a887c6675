"""A tiny CSV line splitter (the project cannot depend on the csv module's dialect handling)."""


def split_line(line: str, delimiter: str = ",") -> list[str]:
    """Split one CSV line into fields.

    Fields may be wrapped in double quotes; inside quotes the delimiter is literal and a doubled quote ("")
    stands for one quote character.
    """
    text = line.rstrip("\r\n")
    fields: list[str] = []
    current: list[str] = []
    in_quotes = False
    i = 0
    while i < len(text):
        ch = text[i]
        if in_quotes:
            if ch == '"' and i + 1 < len(text) and text[i + 1] == '"':
                current.append('"')
                i += 1
            elif ch == '"':
                in_quotes = False
            else:
                current.append(ch)
        elif ch == '"':
            in_quotes = True
        elif ch == delimiter:
            fields.append("".join(current))
            current = []
        else:
            current.append(ch)
        i += 1
    fields.append("".join(current))
    return fields
