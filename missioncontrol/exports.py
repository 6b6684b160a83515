"""Files the pages hand out."""

import re

# A spreadsheet runs a cell starting with one of these as a formula (CSV injection). A spreadsheet set
# to split on ';' or tabs (French ones split on ';') makes a cell of every piece between them: so each
# piece that starts like a formula, first or not, is quoted so that it stays text.
FORMULA = re.compile(r"(^|[;\t])(?=[=+\-@\t\r])")


def safe_cell(value):
    if isinstance(value, str):
        return FORMULA.sub(r"\1'", value)
    return value
