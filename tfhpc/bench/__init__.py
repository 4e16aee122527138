"""make bench: side-by-side measurements of the images, the SIF and a host venv. run.py is the harness (the idle
wait, the sections in turn, the results), context.py what the sections share, sections/ one module per section,
goals.py the goals; stats.py the arithmetic, hostvenv.py the host venv, report.py the outputs, probes/ the programs
mounted into containers."""
