"""The sections of `make bench`, one module each: every one has its figures' ids (id, section, label, unit) and a
`bench_*(ctx, app)` that reports each of them into the context, measured or not."""
