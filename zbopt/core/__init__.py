"""The ground floor: what every other floor stands on, importing nothing of zbopt above it.

`problem/` (the Problem, its parameter table, microbatches that differ), `ops` (the op vocabulary of
`kinds` and the one DAG), `placement`, `schedule` (Schedule as data), `simulation/` (the one
simulator), `timeline` (the orders generators build on), `ticks`, `tolerance`, `units`, `errors`,
`interrupt` (Ctrl-C and the one clock), `wiring` (where upper floors plug in, names loaded on first use),
`paper_tables` (published numbers). Nothing is imported here: `import zbopt.core.ops` loads only that.
"""
