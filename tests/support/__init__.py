"""Helpers the test directories share, each written once (issue 27): the configuration (stack), the parsing of
RESULT lines (results), the check of the collectives smoke test's values (collectives), the site MPIs (site_mpi),
Charliecloud directory images (ch_images), SBOM and provenance checks (attestations), a wheel on the package index
read by range requests (wheels) and the count of the suite's checks (count). tests/ is on sys.path (the root
conftest's directory), so tests import `from support.x import y`."""
