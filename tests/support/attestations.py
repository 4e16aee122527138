"""What the unit, image and publishing tests read from an SBOM or a provenance statement: the CycloneDX schema check
(cyclonedx-python-lib's strict validator, with the schema files that library ships: no network) and the versions
by package kind."""
import re

from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator

SPEC = SchemaVersion.V1_6


def schema_errors(text: str):
    """None when `text` is a valid CycloneDX 1.6 JSON document, else the validator's first error."""
    return JsonStrictValidator(SPEC).validate_str(text)


def versions(bom: dict, kind: str) -> dict[str, str]:
    """name -> version of the Debian packages (kind "deb": package URL pkg:deb/) or of the Python packages (kind
    "python": every other component; names in PEP 503 normal form, as build/images.json has them)."""
    found = {}
    for component in bom["components"]:
        if component.get("purl", "").startswith("pkg:deb/") == (kind == "deb"):
            name = re.sub(r"[-_.]+", "-", component["name"]).lower() if kind == "python" else component["name"]
            found[name] = component["version"]
    return found


def materials(statement: dict) -> dict[str, dict]:
    """name -> resolved dependency of an in-toto statement's SLSA predicate."""
    return {m["name"]: m for m in statement["predicate"]["buildDefinition"]["resolvedDependencies"]}
