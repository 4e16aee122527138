"""make bench: side-by-side measurements of the images, the SIF and a host venv (run.py), their arithmetic
(stats.py), the host venv (hostvenv.py), the outputs (report.py) and the probes mounted into containers (probes/)."""
