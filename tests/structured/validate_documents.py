#!/usr/bin/env python3
"""Validates generated documents with the `jsonschema` package (the independent oracle).

Input: a JSONL file of {"schema": ..., "document": "<text>"}; exits 1 on the first document that
is not valid JSON or does not validate against its schema (draft 2020-12, formats asserted).
"""
import json
import sys
from decimal import Decimal

import jsonschema


def exact_number(text: str):
    """Numbers parsed exactly (binary floats would make large multipleOf checks wrong)."""
    value = Decimal(text)
    return int(value) if value == value.to_integral_value() else value


def main(path: str) -> int:
    checked = 0
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            item = json.loads(line, parse_float=Decimal)
            schema, text = item["schema"], item["document"]
            try:
                instance = json.loads(text, parse_float=exact_number)
            except json.JSONDecodeError as error:
                print(f"not JSON: {text!r}: {error}")
                return 1
            validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
            errors = list(validator.iter_errors(instance))
            if errors:
                print(f"invalid document {text!r} for schema {json.dumps(schema)}: {errors[0].message}")
                return 1
            checked += 1
    print(f"jsonschema validated {checked} generated documents")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
