"""Human-readable durations for job logs."""


def format_duration(seconds: int) -> str:
    """Format a non-negative number of seconds: '1h 02m 03s', '4m 05s', '7s'."""
    if seconds < 0:
        raise ValueError("durations are non-negative")
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes}m {secs}s"
    if minutes:
        return f"{minutes}m {secs}s"
    return f"{secs}s"
