"""Weekly metrics report: statistics and text rendering."""
