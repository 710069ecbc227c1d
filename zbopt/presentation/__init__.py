"""The presentation floor: what people read. Only the interfaces and the root `zbopt` import it.

`display` (how results print and show in Jupyter), `tables` (the CLI's text tables), `report` (the
HTML comparison with `viewer.js`), `plan_report` (a plan's table and page), `plot/` (matplotlib).
Nothing is imported here: `zbopt.presentation.display` does not load matplotlib.
"""
