"""A tiny CSV line splitter (the project cannot depend on the csv module's dialect handling)."""


def split_line(line: str, delimiter: str = ",") -> list[str]:
    """Split one CSV line into fields.

    Fields may be wrapped in double quotes; inside quotes the delimiter is literal and a doubled quote ("")
    stands for one quote character.
    """
    return [field.strip('"') for field in line.rstrip("\r\n").split(delimiter)]
