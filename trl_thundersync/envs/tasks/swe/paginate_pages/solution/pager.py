"""Pagination of in-memory result lists. Pages are numbered from 1."""


def page_count(total: int, per_page: int) -> int:
    """Number of pages needed to show `total` items, `per_page` at a time (at least 1)."""
    if per_page <= 0:
        raise ValueError("per_page must be positive")
    return max(1, -(-total // per_page))


def paginate(items: list, page: int, per_page: int) -> list:
    """The items shown on `page` (1-based). Pages past the end are empty."""
    if page < 1:
        raise ValueError("page numbers start at 1")
    start = (page - 1) * per_page
    return items[start:start + per_page]
