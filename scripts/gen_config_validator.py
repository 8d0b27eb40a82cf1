"""Write src/shardex/config_validator.py: config.schema.json compiled to Python by
fastjsonschema, so that no process pays the ~45 ms of compiling it at run time.

    python scripts/gen_config_validator.py          # after editing the schema
    python scripts/gen_config_validator.py --check  # exit 1 if the module is stale

The module defines its own exception class (the attributes of fastjsonschema's), so that
importing it does not import fastjsonschema's compiler.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import fastjsonschema

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "src" / "shardex" / "schema" / "config.schema.json"
MODULE = ROOT / "src" / "shardex" / "config_validator.py"

HEADER = '''"""The config.yaml validator, generated from schema/config.schema.json by
scripts/gen_config_validator.py (fastjsonschema {version}). Do not edit: run that script.
tests/test_contract_schema.py fails when this file and the schema disagree."""
# ruff: noqa
# mypy: ignore-errors


class JsonSchemaValueException(ValueError):
    """A config.yaml value the schema refuses (fastjsonschema's attributes)."""

    def __init__(self, message, value=None, name=None, definition=None, rule=None):
        super().__init__(message)
        self.message = message
        self.value = value
        self.name = name
        self.definition = definition
        self.rule = rule


JsonSchemaValuesException = JsonSchemaValueException  # never raised: fast_fail is on

'''


def source() -> str:
    schema = json.loads(SCHEMA.read_text("utf-8"))
    code = fastjsonschema.compile_to_code(schema)
    imports = "from fastjsonschema import JsonSchemaValueException, JsonSchemaValuesException\n"
    if imports not in code:
        raise SystemExit("fastjsonschema's generated code changed its imports; update this script")
    code = code.replace(imports, "")
    # A parsed config.yaml never holds a Decimal (YAML and JSON give int and float), and
    # `import decimal` would cost every `import shardex` a few ms.
    decimal = "from decimal import Decimal\n"
    if decimal not in code:
        raise SystemExit("fastjsonschema's generated code changed its imports; update this script")
    code = code.replace(decimal, "").replace("(int, float, Decimal)", "(int, float)")
    if "Decimal" in code:
        raise SystemExit("fastjsonschema's generated code uses Decimal anew; update this script")
    return HEADER.format(version=fastjsonschema.VERSION) + code


def main() -> int:
    text = source()
    if "--check" in sys.argv[1:]:
        if MODULE.read_text("utf-8") != text:
            print(
                f"{MODULE.relative_to(ROOT)} is stale: run python scripts/gen_config_validator.py"
            )
            return 1
        return 0
    MODULE.write_text(text, "utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
