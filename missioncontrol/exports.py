"""Files the pages hand out."""

# A spreadsheet runs a cell starting with one of these as a formula (CSV injection): such a cell is
# quoted so that it stays text.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def safe_cell(value):
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value
