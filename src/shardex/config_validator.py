"""The config.yaml validator, generated from schema/config.schema.json by
scripts/gen_config_validator.py (fastjsonschema 2.22.3). Do not edit: run that script.
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

VERSION = "2.22.3"
import re


REGEX_PATTERNS = {
    '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$': re.compile('^(?!\\.\\.?(/|\\Z))(?!.*/\\.\\.?(/|\\Z))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*\\Z'),
    '^xxh3_64:[0-9a-f]{16}$': re.compile('^xxh3_64:[0-9a-f]{16}\\Z'),
    '^(?!\\.\\.?$)[^/\\\\\\x00-\\x1f\\x7f]{1,255}$': re.compile('^(?!\\.\\.?\\Z)[^/\\\\\\x00-\\x1f\\x7f]{1,255}\\Z')
}

NoneType = type(None)

def validate(data, custom_formats={}, name_prefix=None):
    if not isinstance(data, (dict)):
        raise JsonSchemaValueException("" + (name_prefix or "data") + " must be object", value=data, name="" + (name_prefix or "data") + "", definition={'$schema': 'http://json-schema.org/draft-07/schema#', 'title': 'shardex export contract (config.yaml)', 'type': 'object', 'required': ['format_version', 'backend', 'writer', 'shardex_version', 'num_samples', 'x_keys', 'y_keys', 'key_specs', 'splits'], 'additionalProperties': False, 'properties': {'format_version': {'type': 'integer', 'enum': [1, 2, 3]}, 'backend': {'type': 'string', 'minLength': 1}, 'writer': {'type': 'object', 'required': ['name', 'version'], 'properties': {'name': {'type': 'string'}, 'version': {'type': 'string'}}, 'additionalProperties': {'type': 'string'}}, 'shardex_version': {'type': 'string'}, 'num_samples': {'type': 'integer', 'minimum': 0}, 'label_names': {'type': ['array', 'null'], 'items': {'type': 'string'}}, 'num_classes': {'type': ['integer', 'null'], 'minimum': 0}, 'modality': {'type': 'string'}, 'x_keys': {'type': 'array', 'items': {'type': 'string'}}, 'y_keys': {'type': 'array', 'items': {'type': 'string'}}, 'label_prefix': {'type': 'string'}, 'feature_shapes': {'type': 'object', 'additionalProperties': {'type': 'array', 'items': {'type': ['integer', 'null'], 'minimum': 0}}}, 'key_specs': {'type': 'array', 'items': {'type': 'object', 'required': ['key', 'role', 'dtype'], 'additionalProperties': False, 'properties': {'key': {'type': 'string', 'minLength': 1}, 'role': {'enum': ['x', 'y', 'meta']}, 'dtype': {'type': 'string'}, 'shape': {'oneOf': [{'type': 'null'}, {'$ref': '#/definitions/shape'}]}, 'layout': {'type': ['string', 'null']}, 'encoding': {'type': ['string', 'null']}, 'storage': {'type': 'string'}}}}, 'fields': {'type': 'array', 'items': {'type': 'object', 'required': ['name', 'kind', 'dtype', 'shape'], 'additionalProperties': False, 'properties': {'name': {'type': 'string', 'minLength': 1}, 'kind': {'enum': ['bytes', 'array', 'label']}, 'dtype': {'type': 'string'}, 'shape': {'$ref': '#/definitions/shape'}, 'optional': {'type': 'boolean'}, 'column': {'type': 'string'}}}}, 'spec_fingerprint': {'type': ['string', 'null']}, 'source_datasets': {'type': 'array', 'items': {'type': 'object', 'required': ['uri', 'kind', 'num_samples', 'fingerprint'], 'additionalProperties': False, 'properties': {'uri': {'type': 'string'}, 'kind': {'type': 'string'}, 'num_samples': {'type': 'integer', 'minimum': 0}, 'fingerprint': {'type': 'string'}}}}, 'source_fingerprint': {'type': 'string'}, 'split_method': {'enum': ['single', 'source', 'fractions']}, 'split_seed': {'type': ['integer', 'null']}, 'split_fractions': {'type': ['object', 'null'], 'propertyNames': {'description': 'a split name, which is one folder of the export', 'type': 'string', 'pattern': '^(?!\\.\\.?$)[^/\\\\\\x00-\\x1f\\x7f]{1,255}$'}, 'additionalProperties': {'type': 'number', 'minimum': 0, 'maximum': 1}}, 'shard_options': {'type': 'object'}, 'checksum_algorithm': {'enum': ['xxh3_64']}, 'metadata_file': {'oneOf': [{'type': 'null'}, {'$ref': '#/definitions/relpath'}]}, 'errors_file': {'oneOf': [{'type': 'null'}, {'$ref': '#/definitions/relpath'}]}, 'metadata_checksum': {'oneOf': [{'type': 'null'}, {'$ref': '#/definitions/checksum'}]}, 'errors_checksum': {'oneOf': [{'type': 'null'}, {'$ref': '#/definitions/checksum'}]}, 'num_skipped': {'type': 'integer', 'minimum': 0}, 'pipeline': {'type': 'array', 'items': {'type': 'object'}}, 'extra': {'type': 'object'}, 'splits': {'type': 'object', 'propertyNames': {'description': 'a split name, which is one folder of the export', 'type': 'string', 'pattern': '^(?!\\.\\.?$)[^/\\\\\\x00-\\x1f\\x7f]{1,255}$'}, 'additionalProperties': {'type': 'object', 'required': ['num_samples', 'num_bytes', 'shards'], 'additionalProperties': False, 'properties': {'num_samples': {'$ref': '#/definitions/count'}, 'num_bytes': {'$ref': '#/definitions/count'}, 'shards': {'type': 'array', 'items': {'$ref': '#/definitions/shard'}}, 'files': {'type': 'array', 'items': {'$ref': '#/definitions/relpath'}}, 'keys': {'$ref': '#/definitions/optional_relpath'}, 'index': {'type': ['object', 'null'], 'required': ['samples', 'keys'], 'additionalProperties': False, 'properties': {'samples': {'$ref': '#/definitions/relpath'}, 'keys': {'$ref': '#/definitions/relpath'}, 'members': {'$ref': '#/definitions/relpath'}}}}}}}, 'definitions': {'checksum': {'type': 'string', 'pattern': '^xxh3_64:[0-9a-f]{16}$'}, 'optional_checksum': {'oneOf': [{'type': 'null'}, {'type': 'string', 'pattern': '^xxh3_64:[0-9a-f]{16}$'}]}, 'count': {'type': 'integer', 'minimum': 0}, 'shape': {'type': 'array', 'items': {'type': ['integer', 'null'], 'minimum': 0}}, 'optional_relpath': {'oneOf': [{'type': 'null'}, {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}]}, 'relpath': {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}, 'split_name': {'description': 'a split name, which is one folder of the export', 'type': 'string', 'pattern': '^(?!\\.\\.?$)[^/\\\\\\x00-\\x1f\\x7f]{1,255}$'}, 'key_spec': {'type': 'object', 'required': ['key', 'role', 'dtype'], 'additionalProperties': False, 'properties': {'key': {'type': 'string', 'minLength': 1}, 'role': {'enum': ['x', 'y', 'meta']}, 'dtype': {'type': 'string'}, 'shape': {'oneOf': [{'type': 'null'}, {'type': 'array', 'items': {'type': ['integer', 'null'], 'minimum': 0}}]}, 'layout': {'type': ['string', 'null']}, 'encoding': {'type': ['string', 'null']}, 'storage': {'type': 'string'}}}, 'field': {'type': 'object', 'required': ['name', 'kind', 'dtype', 'shape'], 'additionalProperties': False, 'properties': {'name': {'type': 'string', 'minLength': 1}, 'kind': {'enum': ['bytes', 'array', 'label']}, 'dtype': {'type': 'string'}, 'shape': {'type': 'array', 'items': {'type': ['integer', 'null'], 'minimum': 0}}, 'optional': {'type': 'boolean'}, 'column': {'type': 'string'}}}, 'shard': {'type': 'object', 'required': ['path', 'num_samples', 'num_bytes', 'checksum'], 'additionalProperties': False, 'properties': {'path': {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}, 'num_samples': {'type': 'integer', 'minimum': 0}, 'num_bytes': {'type': 'integer', 'minimum': 0}, 'checksum': {'type': 'string', 'pattern': '^xxh3_64:[0-9a-f]{16}$'}, 'metadata': {'oneOf': [{'type': 'null'}, {'$ref': '#/definitions/relpath'}]}, 'dali_index': {'oneOf': [{'type': 'null'}, {'$ref': '#/definitions/relpath'}]}, 'metadata_checksum': {'oneOf': [{'type': 'null'}, {'$ref': '#/definitions/checksum'}]}}}, 'split': {'type': 'object', 'required': ['num_samples', 'num_bytes', 'shards'], 'additionalProperties': False, 'properties': {'num_samples': {'type': 'integer', 'minimum': 0}, 'num_bytes': {'type': 'integer', 'minimum': 0}, 'shards': {'type': 'array', 'items': {'type': 'object', 'required': ['path', 'num_samples', 'num_bytes', 'checksum'], 'additionalProperties': False, 'properties': {'path': {'$ref': '#/definitions/relpath'}, 'num_samples': {'$ref': '#/definitions/count'}, 'num_bytes': {'$ref': '#/definitions/count'}, 'checksum': {'$ref': '#/definitions/checksum'}, 'metadata': {'$ref': '#/definitions/optional_relpath'}, 'dali_index': {'$ref': '#/definitions/optional_relpath'}, 'metadata_checksum': {'$ref': '#/definitions/optional_checksum'}}}}, 'files': {'type': 'array', 'items': {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}}, 'keys': {'oneOf': [{'type': 'null'}, {'$ref': '#/definitions/relpath'}]}, 'index': {'type': ['object', 'null'], 'required': ['samples', 'keys'], 'additionalProperties': False, 'properties': {'samples': {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}, 'keys': {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}, 'members': {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}}}}}}}, rule='type')
    data_is_dict = isinstance(data, dict)
    if data_is_dict:
        data__missing_keys = set(['format_version', 'backend', 'writer', 'shardex_version', 'num_samples', 'x_keys', 'y_keys', 'key_specs', 'splits']) - data.keys()
        if data__missing_keys:
            raise JsonSchemaValueException("" + (name_prefix or "data") + " must contain " + (str(sorted(data__missing_keys)) + " properties"), value=data, name="" + (name_prefix or "data") + "", definition={'$schema': 'http://json-schema.org/draft-07/schema#', 'title': 'shardex export contract (config.yaml)', 'type': 'object', 'required': ['format_version', 'backend', 'writer', 'shardex_version', 'num_samples', 'x_keys', 'y_keys', 'key_specs', 'splits'], 'additionalProperties': False, 'properties': {'format_version': {'type': 'integer', 'enum': [1, 2, 3]}, 'backend': {'type': 'string', 'minLength': 1}, 'writer': {'type': 'object', 'required': ['name', 'version'], 'properties': {'name': {'type': 'string'}, 'version': {'type': 'string'}}, 'additionalProperties': {'type': 'string'}}, 'shardex_version': {'type': 'string'}, 'num_samples': {'type': 'integer', 'minimum': 0}, 'label_names': {'type': ['array', 'null'], 'items': {'type': 'string'}}, 'num_classes': {'type': ['integer', 'null'], 'minimum': 0}, 'modality': {'type': 'string'}, 'x_keys': {'type': 'array', 'items': {'type': 'string'}}, 'y_keys': {'type': 'array', 'items': {'type': 'string'}}, 'label_prefix': {'type': 'string'}, 'feature_shapes': {'type': 'object', 'additionalProperties': {'type': 'array', 'items': {'type': ['integer', 'null'], 'minimum': 0}}}, 'key_specs': {'type': 'array', 'items': {'type': 'object', 'required': ['key', 'role', 'dtype'], 'additionalProperties': False, 'properties': {'key': {'type': 'string', 'minLength': 1}, 'role': {'enum': ['x', 'y', 'meta']}, 'dtype': {'type': 'string'}, 'shape': {'oneOf': [{'type': 'null'}, {'$ref': '#/definitions/shape'}]}, 'layout': {'type': ['string', 'null']}, 'encoding': {'type': ['string', 'null']}, 'storage': {'type': 'string'}}}}, 'fields': {'type': 'array', 'items': {'type': 'object', 'required': ['name', 'kind', 'dtype', 'shape'], 'additionalProperties': False, 'properties': {'name': {'type': 'string', 'minLength': 1}, 'kind': {'enum': ['bytes', 'array', 'label']}, 'dtype': {'type': 'string'}, 'shape': {'$ref': '#/definitions/shape'}, 'optional': {'type': 'boolean'}, 'column': {'type': 'string'}}}}, 'spec_fingerprint': {'type': ['string', 'null']}, 'source_datasets': {'type': 'array', 'items': {'type': 'object', 'required': ['uri', 'kind', 'num_samples', 'fingerprint'], 'additionalProperties': False, 'properties': {'uri': {'type': 'string'}, 'kind': {'type': 'string'}, 'num_samples': {'type': 'integer', 'minimum': 0}, 'fingerprint': {'type': 'string'}}}}, 'source_fingerprint': {'type': 'string'}, 'split_method': {'enum': ['single', 'source', 'fractions']}, 'split_seed': {'type': ['integer', 'null']}, 'split_fractions': {'type': ['object', 'null'], 'propertyNames': {'description': 'a split name, which is one folder of the export', 'type': 'string', 'pattern': '^(?!\\.\\.?$)[^/\\\\\\x00-\\x1f\\x7f]{1,255}$'}, 'additionalProperties': {'type': 'number', 'minimum': 0, 'maximum': 1}}, 'shard_options': {'type': 'object'}, 'checksum_algorithm': {'enum': ['xxh3_64']}, 'metadata_file': {'oneOf': [{'type': 'null'}, {'$ref': '#/definitions/relpath'}]}, 'errors_file': {'oneOf': [{'type': 'null'}, {'$ref': '#/definitions/relpath'}]}, 'metadata_checksum': {'oneOf': [{'type': 'null'}, {'$ref': '#/definitions/checksum'}]}, 'errors_checksum': {'oneOf': [{'type': 'null'}, {'$ref': '#/definitions/checksum'}]}, 'num_skipped': {'type': 'integer', 'minimum': 0}, 'pipeline': {'type': 'array', 'items': {'type': 'object'}}, 'extra': {'type': 'object'}, 'splits': {'type': 'object', 'propertyNames': {'description': 'a split name, which is one folder of the export', 'type': 'string', 'pattern': '^(?!\\.\\.?$)[^/\\\\\\x00-\\x1f\\x7f]{1,255}$'}, 'additionalProperties': {'type': 'object', 'required': ['num_samples', 'num_bytes', 'shards'], 'additionalProperties': False, 'properties': {'num_samples': {'$ref': '#/definitions/count'}, 'num_bytes': {'$ref': '#/definitions/count'}, 'shards': {'type': 'array', 'items': {'$ref': '#/definitions/shard'}}, 'files': {'type': 'array', 'items': {'$ref': '#/definitions/relpath'}}, 'keys': {'$ref': '#/definitions/optional_relpath'}, 'index': {'type': ['object', 'null'], 'required': ['samples', 'keys'], 'additionalProperties': False, 'properties': {'samples': {'$ref': '#/definitions/relpath'}, 'keys': {'$ref': '#/definitions/relpath'}, 'members': {'$ref': '#/definitions/relpath'}}}}}}}, 'definitions': {'checksum': {'type': 'string', 'pattern': '^xxh3_64:[0-9a-f]{16}$'}, 'optional_checksum': {'oneOf': [{'type': 'null'}, {'type': 'string', 'pattern': '^xxh3_64:[0-9a-f]{16}$'}]}, 'count': {'type': 'integer', 'minimum': 0}, 'shape': {'type': 'array', 'items': {'type': ['integer', 'null'], 'minimum': 0}}, 'optional_relpath': {'oneOf': [{'type': 'null'}, {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}]}, 'relpath': {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}, 'split_name': {'description': 'a split name, which is one folder of the export', 'type': 'string', 'pattern': '^(?!\\.\\.?$)[^/\\\\\\x00-\\x1f\\x7f]{1,255}$'}, 'key_spec': {'type': 'object', 'required': ['key', 'role', 'dtype'], 'additionalProperties': False, 'properties': {'key': {'type': 'string', 'minLength': 1}, 'role': {'enum': ['x', 'y', 'meta']}, 'dtype': {'type': 'string'}, 'shape': {'oneOf': [{'type': 'null'}, {'type': 'array', 'items': {'type': ['integer', 'null'], 'minimum': 0}}]}, 'layout': {'type': ['string', 'null']}, 'encoding': {'type': ['string', 'null']}, 'storage': {'type': 'string'}}}, 'field': {'type': 'object', 'required': ['name', 'kind', 'dtype', 'shape'], 'additionalProperties': False, 'properties': {'name': {'type': 'string', 'minLength': 1}, 'kind': {'enum': ['bytes', 'array', 'label']}, 'dtype': {'type': 'string'}, 'shape': {'type': 'array', 'items': {'type': ['integer', 'null'], 'minimum': 0}}, 'optional': {'type': 'boolean'}, 'column': {'type': 'string'}}}, 'shard': {'type': 'object', 'required': ['path', 'num_samples', 'num_bytes', 'checksum'], 'additionalProperties': False, 'properties': {'path': {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}, 'num_samples': {'type': 'integer', 'minimum': 0}, 'num_bytes': {'type': 'integer', 'minimum': 0}, 'checksum': {'type': 'string', 'pattern': '^xxh3_64:[0-9a-f]{16}$'}, 'metadata': {'oneOf': [{'type': 'null'}, {'$ref': '#/definitions/relpath'}]}, 'dali_index': {'oneOf': [{'type': 'null'}, {'$ref': '#/definitions/relpath'}]}, 'metadata_checksum': {'oneOf': [{'type': 'null'}, {'$ref': '#/definitions/checksum'}]}}}, 'split': {'type': 'object', 'required': ['num_samples', 'num_bytes', 'shards'], 'additionalProperties': False, 'properties': {'num_samples': {'type': 'integer', 'minimum': 0}, 'num_bytes': {'type': 'integer', 'minimum': 0}, 'shards': {'type': 'array', 'items': {'type': 'object', 'required': ['path', 'num_samples', 'num_bytes', 'checksum'], 'additionalProperties': False, 'properties': {'path': {'$ref': '#/definitions/relpath'}, 'num_samples': {'$ref': '#/definitions/count'}, 'num_bytes': {'$ref': '#/definitions/count'}, 'checksum': {'$ref': '#/definitions/checksum'}, 'metadata': {'$ref': '#/definitions/optional_relpath'}, 'dali_index': {'$ref': '#/definitions/optional_relpath'}, 'metadata_checksum': {'$ref': '#/definitions/optional_checksum'}}}}, 'files': {'type': 'array', 'items': {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}}, 'keys': {'oneOf': [{'type': 'null'}, {'$ref': '#/definitions/relpath'}]}, 'index': {'type': ['object', 'null'], 'required': ['samples', 'keys'], 'additionalProperties': False, 'properties': {'samples': {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}, 'keys': {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}, 'members': {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}}}}}}}, rule='required')
        data_keys = set(data.keys())
        if "format_version" in data_keys:
            data_keys.remove("format_version")
            data__formatversion = data["format_version"]
            if not isinstance(data__formatversion, (int)) and not (isinstance(data__formatversion, float) and data__formatversion.is_integer()) or isinstance(data__formatversion, bool):
                raise JsonSchemaValueException("" + (name_prefix or "data") + ".format_version must be integer", value=data__formatversion, name="" + (name_prefix or "data") + ".format_version", definition={'type': 'integer', 'enum': [1, 2, 3]}, rule='type')
            if not (isinstance(data__formatversion, (int, float)) and not isinstance(data__formatversion, bool) and data__formatversion == 1 or isinstance(data__formatversion, (int, float)) and not isinstance(data__formatversion, bool) and data__formatversion == 2 or isinstance(data__formatversion, (int, float)) and not isinstance(data__formatversion, bool) and data__formatversion == 3):
                raise JsonSchemaValueException("" + (name_prefix or "data") + ".format_version must be one of [1, 2, 3]", value=data__formatversion, name="" + (name_prefix or "data") + ".format_version", definition={'type': 'integer', 'enum': [1, 2, 3]}, rule='enum')
        if "backend" in data_keys:
            data_keys.remove("backend")
            data__backend = data["backend"]
            if not isinstance(data__backend, (str)):
                raise JsonSchemaValueException("" + (name_prefix or "data") + ".backend must be string", value=data__backend, name="" + (name_prefix or "data") + ".backend", definition={'type': 'string', 'minLength': 1}, rule='type')
            if isinstance(data__backend, str):
                data__backend_len = len(data__backend)
                if data__backend_len < 1:
                    raise JsonSchemaValueException("" + (name_prefix or "data") + ".backend must be longer than or equal to 1 characters", value=data__backend, name="" + (name_prefix or "data") + ".backend", definition={'type': 'string', 'minLength': 1}, rule='minLength')
        if "writer" in data_keys:
            data_keys.remove("writer")
            data__writer = data["writer"]
            if not isinstance(data__writer, (dict)):
                raise JsonSchemaValueException("" + (name_prefix or "data") + ".writer must be object", value=data__writer, name="" + (name_prefix or "data") + ".writer", definition={'type': 'object', 'required': ['name', 'version'], 'properties': {'name': {'type': 'string'}, 'version': {'type': 'string'}}, 'additionalProperties': {'type': 'string'}}, rule='type')
            data__writer_is_dict = isinstance(data__writer, dict)
            if data__writer_is_dict:
                data__writer__missing_keys = set(['name', 'version']) - data__writer.keys()
                if data__writer__missing_keys:
                    raise JsonSchemaValueException("" + (name_prefix or "data") + ".writer must contain " + (str(sorted(data__writer__missing_keys)) + " properties"), value=data__writer, name="" + (name_prefix or "data") + ".writer", definition={'type': 'object', 'required': ['name', 'version'], 'properties': {'name': {'type': 'string'}, 'version': {'type': 'string'}}, 'additionalProperties': {'type': 'string'}}, rule='required')
                data__writer_keys = set(data__writer.keys())
                if "name" in data__writer_keys:
                    data__writer_keys.remove("name")
                    data__writer__name = data__writer["name"]
                    if not isinstance(data__writer__name, (str)):
                        raise JsonSchemaValueException("" + (name_prefix or "data") + ".writer.name must be string", value=data__writer__name, name="" + (name_prefix or "data") + ".writer.name", definition={'type': 'string'}, rule='type')
                if "version" in data__writer_keys:
                    data__writer_keys.remove("version")
                    data__writer__version = data__writer["version"]
                    if not isinstance(data__writer__version, (str)):
                        raise JsonSchemaValueException("" + (name_prefix or "data") + ".writer.version must be string", value=data__writer__version, name="" + (name_prefix or "data") + ".writer.version", definition={'type': 'string'}, rule='type')
                for data__writer_key in data__writer_keys:
                    if data__writer_key not in ['name', 'version']:
                        data__writer_value = data__writer.get(data__writer_key)
                        if not isinstance(data__writer_value, (str)):
                            raise JsonSchemaValueException("" + (name_prefix or "data") + ".writer.{data__writer_key}".format(**locals()) + " must be string", value=data__writer_value, name="" + (name_prefix or "data") + ".writer.{data__writer_key}".format(**locals()) + "", definition={'type': 'string'}, rule='type')
        if "shardex_version" in data_keys:
            data_keys.remove("shardex_version")
            data__shardexversion = data["shardex_version"]
            if not isinstance(data__shardexversion, (str)):
                raise JsonSchemaValueException("" + (name_prefix or "data") + ".shardex_version must be string", value=data__shardexversion, name="" + (name_prefix or "data") + ".shardex_version", definition={'type': 'string'}, rule='type')
        if "num_samples" in data_keys:
            data_keys.remove("num_samples")
            data__numsamples = data["num_samples"]
            validate___definitions_count(data__numsamples, custom_formats, (name_prefix or "data") + ".num_samples")
        if "label_names" in data_keys:
            data_keys.remove("label_names")
            data__labelnames = data["label_names"]
            if not isinstance(data__labelnames, (list, tuple, NoneType)):
                raise JsonSchemaValueException("" + (name_prefix or "data") + ".label_names must be array or null", value=data__labelnames, name="" + (name_prefix or "data") + ".label_names", definition={'type': ['array', 'null'], 'items': {'type': 'string'}}, rule='type')
            data__labelnames_is_list = isinstance(data__labelnames, (list, tuple))
            if data__labelnames_is_list:
                data__labelnames_len = len(data__labelnames)
                for data__labelnames_x, data__labelnames_item in enumerate(data__labelnames):
                    if not isinstance(data__labelnames_item, (str)):
                        raise JsonSchemaValueException("" + (name_prefix or "data") + ".label_names[{data__labelnames_x}]".format(**locals()) + " must be string", value=data__labelnames_item, name="" + (name_prefix or "data") + ".label_names[{data__labelnames_x}]".format(**locals()) + "", definition={'type': 'string'}, rule='type')
        if "num_classes" in data_keys:
            data_keys.remove("num_classes")
            data__numclasses = data["num_classes"]
            if not isinstance(data__numclasses, (int, NoneType)) and not (isinstance(data__numclasses, float) and data__numclasses.is_integer()) or isinstance(data__numclasses, bool):
                raise JsonSchemaValueException("" + (name_prefix or "data") + ".num_classes must be integer or null", value=data__numclasses, name="" + (name_prefix or "data") + ".num_classes", definition={'type': ['integer', 'null'], 'minimum': 0}, rule='type')
            if isinstance(data__numclasses, (int, float)) and not isinstance(data__numclasses, bool):
                if data__numclasses < 0:
                    raise JsonSchemaValueException("" + (name_prefix or "data") + ".num_classes must be bigger than or equal to 0", value=data__numclasses, name="" + (name_prefix or "data") + ".num_classes", definition={'type': ['integer', 'null'], 'minimum': 0}, rule='minimum')
        if "modality" in data_keys:
            data_keys.remove("modality")
            data__modality = data["modality"]
            if not isinstance(data__modality, (str)):
                raise JsonSchemaValueException("" + (name_prefix or "data") + ".modality must be string", value=data__modality, name="" + (name_prefix or "data") + ".modality", definition={'type': 'string'}, rule='type')
        if "x_keys" in data_keys:
            data_keys.remove("x_keys")
            data__xkeys = data["x_keys"]
            if not isinstance(data__xkeys, (list, tuple)):
                raise JsonSchemaValueException("" + (name_prefix or "data") + ".x_keys must be array", value=data__xkeys, name="" + (name_prefix or "data") + ".x_keys", definition={'type': 'array', 'items': {'type': 'string'}}, rule='type')
            data__xkeys_is_list = isinstance(data__xkeys, (list, tuple))
            if data__xkeys_is_list:
                data__xkeys_len = len(data__xkeys)
                for data__xkeys_x, data__xkeys_item in enumerate(data__xkeys):
                    if not isinstance(data__xkeys_item, (str)):
                        raise JsonSchemaValueException("" + (name_prefix or "data") + ".x_keys[{data__xkeys_x}]".format(**locals()) + " must be string", value=data__xkeys_item, name="" + (name_prefix or "data") + ".x_keys[{data__xkeys_x}]".format(**locals()) + "", definition={'type': 'string'}, rule='type')
        if "y_keys" in data_keys:
            data_keys.remove("y_keys")
            data__ykeys = data["y_keys"]
            if not isinstance(data__ykeys, (list, tuple)):
                raise JsonSchemaValueException("" + (name_prefix or "data") + ".y_keys must be array", value=data__ykeys, name="" + (name_prefix or "data") + ".y_keys", definition={'type': 'array', 'items': {'type': 'string'}}, rule='type')
            data__ykeys_is_list = isinstance(data__ykeys, (list, tuple))
            if data__ykeys_is_list:
                data__ykeys_len = len(data__ykeys)
                for data__ykeys_x, data__ykeys_item in enumerate(data__ykeys):
                    if not isinstance(data__ykeys_item, (str)):
                        raise JsonSchemaValueException("" + (name_prefix or "data") + ".y_keys[{data__ykeys_x}]".format(**locals()) + " must be string", value=data__ykeys_item, name="" + (name_prefix or "data") + ".y_keys[{data__ykeys_x}]".format(**locals()) + "", definition={'type': 'string'}, rule='type')
        if "label_prefix" in data_keys:
            data_keys.remove("label_prefix")
            data__labelprefix = data["label_prefix"]
            if not isinstance(data__labelprefix, (str)):
                raise JsonSchemaValueException("" + (name_prefix or "data") + ".label_prefix must be string", value=data__labelprefix, name="" + (name_prefix or "data") + ".label_prefix", definition={'type': 'string'}, rule='type')
        if "feature_shapes" in data_keys:
            data_keys.remove("feature_shapes")
            data__featureshapes = data["feature_shapes"]
            if not isinstance(data__featureshapes, (dict)):
                raise JsonSchemaValueException("" + (name_prefix or "data") + ".feature_shapes must be object", value=data__featureshapes, name="" + (name_prefix or "data") + ".feature_shapes", definition={'type': 'object', 'additionalProperties': {'type': 'array', 'items': {'type': ['integer', 'null'], 'minimum': 0}}}, rule='type')
            data__featureshapes_is_dict = isinstance(data__featureshapes, dict)
            if data__featureshapes_is_dict:
                data__featureshapes_keys = set(data__featureshapes.keys())
                for data__featureshapes_key in data__featureshapes_keys:
                    if data__featureshapes_key not in []:
                        data__featureshapes_value = data__featureshapes.get(data__featureshapes_key)
                        validate___definitions_shape(data__featureshapes_value, custom_formats, (name_prefix or "data") + ".feature_shapes.{data__featureshapes_key}".format(**locals()))
        if "key_specs" in data_keys:
            data_keys.remove("key_specs")
            data__keyspecs = data["key_specs"]
            if not isinstance(data__keyspecs, (list, tuple)):
                raise JsonSchemaValueException("" + (name_prefix or "data") + ".key_specs must be array", value=data__keyspecs, name="" + (name_prefix or "data") + ".key_specs", definition={'type': 'array', 'items': {'type': 'object', 'required': ['key', 'role', 'dtype'], 'additionalProperties': False, 'properties': {'key': {'type': 'string', 'minLength': 1}, 'role': {'enum': ['x', 'y', 'meta']}, 'dtype': {'type': 'string'}, 'shape': {'oneOf': [{'type': 'null'}, {'$ref': '#/definitions/shape'}]}, 'layout': {'type': ['string', 'null']}, 'encoding': {'type': ['string', 'null']}, 'storage': {'type': 'string'}}}}, rule='type')
            data__keyspecs_is_list = isinstance(data__keyspecs, (list, tuple))
            if data__keyspecs_is_list:
                data__keyspecs_len = len(data__keyspecs)
                for data__keyspecs_x, data__keyspecs_item in enumerate(data__keyspecs):
                    validate___definitions_key_spec(data__keyspecs_item, custom_formats, (name_prefix or "data") + ".key_specs[{data__keyspecs_x}]".format(**locals()))
        if "fields" in data_keys:
            data_keys.remove("fields")
            data__fields = data["fields"]
            if not isinstance(data__fields, (list, tuple)):
                raise JsonSchemaValueException("" + (name_prefix or "data") + ".fields must be array", value=data__fields, name="" + (name_prefix or "data") + ".fields", definition={'type': 'array', 'items': {'type': 'object', 'required': ['name', 'kind', 'dtype', 'shape'], 'additionalProperties': False, 'properties': {'name': {'type': 'string', 'minLength': 1}, 'kind': {'enum': ['bytes', 'array', 'label']}, 'dtype': {'type': 'string'}, 'shape': {'$ref': '#/definitions/shape'}, 'optional': {'type': 'boolean'}, 'column': {'type': 'string'}}}}, rule='type')
            data__fields_is_list = isinstance(data__fields, (list, tuple))
            if data__fields_is_list:
                data__fields_len = len(data__fields)
                for data__fields_x, data__fields_item in enumerate(data__fields):
                    validate___definitions_field(data__fields_item, custom_formats, (name_prefix or "data") + ".fields[{data__fields_x}]".format(**locals()))
        if "spec_fingerprint" in data_keys:
            data_keys.remove("spec_fingerprint")
            data__specfingerprint = data["spec_fingerprint"]
            if not isinstance(data__specfingerprint, (str, NoneType)):
                raise JsonSchemaValueException("" + (name_prefix or "data") + ".spec_fingerprint must be string or null", value=data__specfingerprint, name="" + (name_prefix or "data") + ".spec_fingerprint", definition={'type': ['string', 'null']}, rule='type')
        if "source_datasets" in data_keys:
            data_keys.remove("source_datasets")
            data__sourcedatasets = data["source_datasets"]
            if not isinstance(data__sourcedatasets, (list, tuple)):
                raise JsonSchemaValueException("" + (name_prefix or "data") + ".source_datasets must be array", value=data__sourcedatasets, name="" + (name_prefix or "data") + ".source_datasets", definition={'type': 'array', 'items': {'type': 'object', 'required': ['uri', 'kind', 'num_samples', 'fingerprint'], 'additionalProperties': False, 'properties': {'uri': {'type': 'string'}, 'kind': {'type': 'string'}, 'num_samples': {'type': 'integer', 'minimum': 0}, 'fingerprint': {'type': 'string'}}}}, rule='type')
            data__sourcedatasets_is_list = isinstance(data__sourcedatasets, (list, tuple))
            if data__sourcedatasets_is_list:
                data__sourcedatasets_len = len(data__sourcedatasets)
                for data__sourcedatasets_x, data__sourcedatasets_item in enumerate(data__sourcedatasets):
                    if not isinstance(data__sourcedatasets_item, (dict)):
                        raise JsonSchemaValueException("" + (name_prefix or "data") + ".source_datasets[{data__sourcedatasets_x}]".format(**locals()) + " must be object", value=data__sourcedatasets_item, name="" + (name_prefix or "data") + ".source_datasets[{data__sourcedatasets_x}]".format(**locals()) + "", definition={'type': 'object', 'required': ['uri', 'kind', 'num_samples', 'fingerprint'], 'additionalProperties': False, 'properties': {'uri': {'type': 'string'}, 'kind': {'type': 'string'}, 'num_samples': {'type': 'integer', 'minimum': 0}, 'fingerprint': {'type': 'string'}}}, rule='type')
                    data__sourcedatasets_item_is_dict = isinstance(data__sourcedatasets_item, dict)
                    if data__sourcedatasets_item_is_dict:
                        data__sourcedatasets_item__missing_keys = set(['uri', 'kind', 'num_samples', 'fingerprint']) - data__sourcedatasets_item.keys()
                        if data__sourcedatasets_item__missing_keys:
                            raise JsonSchemaValueException("" + (name_prefix or "data") + ".source_datasets[{data__sourcedatasets_x}]".format(**locals()) + " must contain " + (str(sorted(data__sourcedatasets_item__missing_keys)) + " properties"), value=data__sourcedatasets_item, name="" + (name_prefix or "data") + ".source_datasets[{data__sourcedatasets_x}]".format(**locals()) + "", definition={'type': 'object', 'required': ['uri', 'kind', 'num_samples', 'fingerprint'], 'additionalProperties': False, 'properties': {'uri': {'type': 'string'}, 'kind': {'type': 'string'}, 'num_samples': {'type': 'integer', 'minimum': 0}, 'fingerprint': {'type': 'string'}}}, rule='required')
                        data__sourcedatasets_item_keys = set(data__sourcedatasets_item.keys())
                        if "uri" in data__sourcedatasets_item_keys:
                            data__sourcedatasets_item_keys.remove("uri")
                            data__sourcedatasets_item__uri = data__sourcedatasets_item["uri"]
                            if not isinstance(data__sourcedatasets_item__uri, (str)):
                                raise JsonSchemaValueException("" + (name_prefix or "data") + ".source_datasets[{data__sourcedatasets_x}].uri".format(**locals()) + " must be string", value=data__sourcedatasets_item__uri, name="" + (name_prefix or "data") + ".source_datasets[{data__sourcedatasets_x}].uri".format(**locals()) + "", definition={'type': 'string'}, rule='type')
                        if "kind" in data__sourcedatasets_item_keys:
                            data__sourcedatasets_item_keys.remove("kind")
                            data__sourcedatasets_item__kind = data__sourcedatasets_item["kind"]
                            if not isinstance(data__sourcedatasets_item__kind, (str)):
                                raise JsonSchemaValueException("" + (name_prefix or "data") + ".source_datasets[{data__sourcedatasets_x}].kind".format(**locals()) + " must be string", value=data__sourcedatasets_item__kind, name="" + (name_prefix or "data") + ".source_datasets[{data__sourcedatasets_x}].kind".format(**locals()) + "", definition={'type': 'string'}, rule='type')
                        if "num_samples" in data__sourcedatasets_item_keys:
                            data__sourcedatasets_item_keys.remove("num_samples")
                            data__sourcedatasets_item__numsamples = data__sourcedatasets_item["num_samples"]
                            validate___definitions_count(data__sourcedatasets_item__numsamples, custom_formats, (name_prefix or "data") + ".source_datasets[{data__sourcedatasets_x}].num_samples".format(**locals()))
                        if "fingerprint" in data__sourcedatasets_item_keys:
                            data__sourcedatasets_item_keys.remove("fingerprint")
                            data__sourcedatasets_item__fingerprint = data__sourcedatasets_item["fingerprint"]
                            if not isinstance(data__sourcedatasets_item__fingerprint, (str)):
                                raise JsonSchemaValueException("" + (name_prefix or "data") + ".source_datasets[{data__sourcedatasets_x}].fingerprint".format(**locals()) + " must be string", value=data__sourcedatasets_item__fingerprint, name="" + (name_prefix or "data") + ".source_datasets[{data__sourcedatasets_x}].fingerprint".format(**locals()) + "", definition={'type': 'string'}, rule='type')
                        if data__sourcedatasets_item_keys:
                            raise JsonSchemaValueException("" + (name_prefix or "data") + ".source_datasets[{data__sourcedatasets_x}]".format(**locals()) + " must not contain "+str(data__sourcedatasets_item_keys)+" properties", value=data__sourcedatasets_item, name="" + (name_prefix or "data") + ".source_datasets[{data__sourcedatasets_x}]".format(**locals()) + "", definition={'type': 'object', 'required': ['uri', 'kind', 'num_samples', 'fingerprint'], 'additionalProperties': False, 'properties': {'uri': {'type': 'string'}, 'kind': {'type': 'string'}, 'num_samples': {'type': 'integer', 'minimum': 0}, 'fingerprint': {'type': 'string'}}}, rule='additionalProperties')
        if "source_fingerprint" in data_keys:
            data_keys.remove("source_fingerprint")
            data__sourcefingerprint = data["source_fingerprint"]
            if not isinstance(data__sourcefingerprint, (str)):
                raise JsonSchemaValueException("" + (name_prefix or "data") + ".source_fingerprint must be string", value=data__sourcefingerprint, name="" + (name_prefix or "data") + ".source_fingerprint", definition={'type': 'string'}, rule='type')
        if "split_method" in data_keys:
            data_keys.remove("split_method")
            data__splitmethod = data["split_method"]
            if not (isinstance(data__splitmethod, str) and data__splitmethod == 'single' or isinstance(data__splitmethod, str) and data__splitmethod == 'source' or isinstance(data__splitmethod, str) and data__splitmethod == 'fractions'):
                raise JsonSchemaValueException("" + (name_prefix or "data") + ".split_method must be one of ['single', 'source', 'fractions']", value=data__splitmethod, name="" + (name_prefix or "data") + ".split_method", definition={'enum': ['single', 'source', 'fractions']}, rule='enum')
        if "split_seed" in data_keys:
            data_keys.remove("split_seed")
            data__splitseed = data["split_seed"]
            if not isinstance(data__splitseed, (int, NoneType)) and not (isinstance(data__splitseed, float) and data__splitseed.is_integer()) or isinstance(data__splitseed, bool):
                raise JsonSchemaValueException("" + (name_prefix or "data") + ".split_seed must be integer or null", value=data__splitseed, name="" + (name_prefix or "data") + ".split_seed", definition={'type': ['integer', 'null']}, rule='type')
        if "split_fractions" in data_keys:
            data_keys.remove("split_fractions")
            data__splitfractions = data["split_fractions"]
            if not isinstance(data__splitfractions, (dict, NoneType)):
                raise JsonSchemaValueException("" + (name_prefix or "data") + ".split_fractions must be object or null", value=data__splitfractions, name="" + (name_prefix or "data") + ".split_fractions", definition={'type': ['object', 'null'], 'propertyNames': {'description': 'a split name, which is one folder of the export', 'type': 'string', 'pattern': '^(?!\\.\\.?$)[^/\\\\\\x00-\\x1f\\x7f]{1,255}$'}, 'additionalProperties': {'type': 'number', 'minimum': 0, 'maximum': 1}}, rule='type')
            data__splitfractions_is_dict = isinstance(data__splitfractions, dict)
            if data__splitfractions_is_dict:
                data__splitfractions_keys = set(data__splitfractions.keys())
                for data__splitfractions_key in data__splitfractions_keys:
                    if data__splitfractions_key not in []:
                        data__splitfractions_value = data__splitfractions.get(data__splitfractions_key)
                        if not isinstance(data__splitfractions_value, (int, float)) or isinstance(data__splitfractions_value, bool):
                            raise JsonSchemaValueException("" + (name_prefix or "data") + ".split_fractions.{data__splitfractions_key}".format(**locals()) + " must be number", value=data__splitfractions_value, name="" + (name_prefix or "data") + ".split_fractions.{data__splitfractions_key}".format(**locals()) + "", definition={'type': 'number', 'minimum': 0, 'maximum': 1}, rule='type')
                        if isinstance(data__splitfractions_value, (int, float)) and not isinstance(data__splitfractions_value, bool):
                            if data__splitfractions_value < 0:
                                raise JsonSchemaValueException("" + (name_prefix or "data") + ".split_fractions.{data__splitfractions_key}".format(**locals()) + " must be bigger than or equal to 0", value=data__splitfractions_value, name="" + (name_prefix or "data") + ".split_fractions.{data__splitfractions_key}".format(**locals()) + "", definition={'type': 'number', 'minimum': 0, 'maximum': 1}, rule='minimum')
                            if data__splitfractions_value > 1:
                                raise JsonSchemaValueException("" + (name_prefix or "data") + ".split_fractions.{data__splitfractions_key}".format(**locals()) + " must be smaller than or equal to 1", value=data__splitfractions_value, name="" + (name_prefix or "data") + ".split_fractions.{data__splitfractions_key}".format(**locals()) + "", definition={'type': 'number', 'minimum': 0, 'maximum': 1}, rule='maximum')
                data__splitfractions_len = len(data__splitfractions)
                if data__splitfractions_len != 0:
                    data__splitfractions_property_names = True
                    for data__splitfractions_key in data__splitfractions:
                        try:
                            validate___definitions_split_name(data__splitfractions_key, custom_formats, (name_prefix or "data") + ".split_fractions")
                        except (JsonSchemaValueException, JsonSchemaValuesException):
                            data__splitfractions_property_names = False
                    if not data__splitfractions_property_names:
                        raise JsonSchemaValueException("" + (name_prefix or "data") + ".split_fractions must be named by propertyName definition", value=data__splitfractions, name="" + (name_prefix or "data") + ".split_fractions", definition={'type': ['object', 'null'], 'propertyNames': {'description': 'a split name, which is one folder of the export', 'type': 'string', 'pattern': '^(?!\\.\\.?$)[^/\\\\\\x00-\\x1f\\x7f]{1,255}$'}, 'additionalProperties': {'type': 'number', 'minimum': 0, 'maximum': 1}}, rule='propertyNames')
        if "shard_options" in data_keys:
            data_keys.remove("shard_options")
            data__shardoptions = data["shard_options"]
            if not isinstance(data__shardoptions, (dict)):
                raise JsonSchemaValueException("" + (name_prefix or "data") + ".shard_options must be object", value=data__shardoptions, name="" + (name_prefix or "data") + ".shard_options", definition={'type': 'object'}, rule='type')
        if "checksum_algorithm" in data_keys:
            data_keys.remove("checksum_algorithm")
            data__checksumalgorithm = data["checksum_algorithm"]
            if not (isinstance(data__checksumalgorithm, str) and data__checksumalgorithm == 'xxh3_64'):
                raise JsonSchemaValueException("" + (name_prefix or "data") + ".checksum_algorithm must be one of ['xxh3_64']", value=data__checksumalgorithm, name="" + (name_prefix or "data") + ".checksum_algorithm", definition={'enum': ['xxh3_64']}, rule='enum')
        if "metadata_file" in data_keys:
            data_keys.remove("metadata_file")
            data__metadatafile = data["metadata_file"]
            validate___definitions_optional_relpath(data__metadatafile, custom_formats, (name_prefix or "data") + ".metadata_file")
        if "errors_file" in data_keys:
            data_keys.remove("errors_file")
            data__errorsfile = data["errors_file"]
            validate___definitions_optional_relpath(data__errorsfile, custom_formats, (name_prefix or "data") + ".errors_file")
        if "metadata_checksum" in data_keys:
            data_keys.remove("metadata_checksum")
            data__metadatachecksum = data["metadata_checksum"]
            validate___definitions_optional_checksum(data__metadatachecksum, custom_formats, (name_prefix or "data") + ".metadata_checksum")
        if "errors_checksum" in data_keys:
            data_keys.remove("errors_checksum")
            data__errorschecksum = data["errors_checksum"]
            validate___definitions_optional_checksum(data__errorschecksum, custom_formats, (name_prefix or "data") + ".errors_checksum")
        if "num_skipped" in data_keys:
            data_keys.remove("num_skipped")
            data__numskipped = data["num_skipped"]
            validate___definitions_count(data__numskipped, custom_formats, (name_prefix or "data") + ".num_skipped")
        if "pipeline" in data_keys:
            data_keys.remove("pipeline")
            data__pipeline = data["pipeline"]
            if not isinstance(data__pipeline, (list, tuple)):
                raise JsonSchemaValueException("" + (name_prefix or "data") + ".pipeline must be array", value=data__pipeline, name="" + (name_prefix or "data") + ".pipeline", definition={'type': 'array', 'items': {'type': 'object'}}, rule='type')
            data__pipeline_is_list = isinstance(data__pipeline, (list, tuple))
            if data__pipeline_is_list:
                data__pipeline_len = len(data__pipeline)
                for data__pipeline_x, data__pipeline_item in enumerate(data__pipeline):
                    if not isinstance(data__pipeline_item, (dict)):
                        raise JsonSchemaValueException("" + (name_prefix or "data") + ".pipeline[{data__pipeline_x}]".format(**locals()) + " must be object", value=data__pipeline_item, name="" + (name_prefix or "data") + ".pipeline[{data__pipeline_x}]".format(**locals()) + "", definition={'type': 'object'}, rule='type')
        if "extra" in data_keys:
            data_keys.remove("extra")
            data__extra = data["extra"]
            if not isinstance(data__extra, (dict)):
                raise JsonSchemaValueException("" + (name_prefix or "data") + ".extra must be object", value=data__extra, name="" + (name_prefix or "data") + ".extra", definition={'type': 'object'}, rule='type')
        if "splits" in data_keys:
            data_keys.remove("splits")
            data__splits = data["splits"]
            if not isinstance(data__splits, (dict)):
                raise JsonSchemaValueException("" + (name_prefix or "data") + ".splits must be object", value=data__splits, name="" + (name_prefix or "data") + ".splits", definition={'type': 'object', 'propertyNames': {'description': 'a split name, which is one folder of the export', 'type': 'string', 'pattern': '^(?!\\.\\.?$)[^/\\\\\\x00-\\x1f\\x7f]{1,255}$'}, 'additionalProperties': {'type': 'object', 'required': ['num_samples', 'num_bytes', 'shards'], 'additionalProperties': False, 'properties': {'num_samples': {'$ref': '#/definitions/count'}, 'num_bytes': {'$ref': '#/definitions/count'}, 'shards': {'type': 'array', 'items': {'$ref': '#/definitions/shard'}}, 'files': {'type': 'array', 'items': {'$ref': '#/definitions/relpath'}}, 'keys': {'$ref': '#/definitions/optional_relpath'}, 'index': {'type': ['object', 'null'], 'required': ['samples', 'keys'], 'additionalProperties': False, 'properties': {'samples': {'$ref': '#/definitions/relpath'}, 'keys': {'$ref': '#/definitions/relpath'}, 'members': {'$ref': '#/definitions/relpath'}}}}}}, rule='type')
            data__splits_is_dict = isinstance(data__splits, dict)
            if data__splits_is_dict:
                data__splits_keys = set(data__splits.keys())
                for data__splits_key in data__splits_keys:
                    if data__splits_key not in []:
                        data__splits_value = data__splits.get(data__splits_key)
                        validate___definitions_split(data__splits_value, custom_formats, (name_prefix or "data") + ".splits.{data__splits_key}".format(**locals()))
                data__splits_len = len(data__splits)
                if data__splits_len != 0:
                    data__splits_property_names = True
                    for data__splits_key in data__splits:
                        try:
                            validate___definitions_split_name(data__splits_key, custom_formats, (name_prefix or "data") + ".splits")
                        except (JsonSchemaValueException, JsonSchemaValuesException):
                            data__splits_property_names = False
                    if not data__splits_property_names:
                        raise JsonSchemaValueException("" + (name_prefix or "data") + ".splits must be named by propertyName definition", value=data__splits, name="" + (name_prefix or "data") + ".splits", definition={'type': 'object', 'propertyNames': {'description': 'a split name, which is one folder of the export', 'type': 'string', 'pattern': '^(?!\\.\\.?$)[^/\\\\\\x00-\\x1f\\x7f]{1,255}$'}, 'additionalProperties': {'type': 'object', 'required': ['num_samples', 'num_bytes', 'shards'], 'additionalProperties': False, 'properties': {'num_samples': {'$ref': '#/definitions/count'}, 'num_bytes': {'$ref': '#/definitions/count'}, 'shards': {'type': 'array', 'items': {'$ref': '#/definitions/shard'}}, 'files': {'type': 'array', 'items': {'$ref': '#/definitions/relpath'}}, 'keys': {'$ref': '#/definitions/optional_relpath'}, 'index': {'type': ['object', 'null'], 'required': ['samples', 'keys'], 'additionalProperties': False, 'properties': {'samples': {'$ref': '#/definitions/relpath'}, 'keys': {'$ref': '#/definitions/relpath'}, 'members': {'$ref': '#/definitions/relpath'}}}}}}, rule='propertyNames')
        if data_keys:
            raise JsonSchemaValueException("" + (name_prefix or "data") + " must not contain "+str(data_keys)+" properties", value=data, name="" + (name_prefix or "data") + "", definition={'$schema': 'http://json-schema.org/draft-07/schema#', 'title': 'shardex export contract (config.yaml)', 'type': 'object', 'required': ['format_version', 'backend', 'writer', 'shardex_version', 'num_samples', 'x_keys', 'y_keys', 'key_specs', 'splits'], 'additionalProperties': False, 'properties': {'format_version': {'type': 'integer', 'enum': [1, 2, 3]}, 'backend': {'type': 'string', 'minLength': 1}, 'writer': {'type': 'object', 'required': ['name', 'version'], 'properties': {'name': {'type': 'string'}, 'version': {'type': 'string'}}, 'additionalProperties': {'type': 'string'}}, 'shardex_version': {'type': 'string'}, 'num_samples': {'type': 'integer', 'minimum': 0}, 'label_names': {'type': ['array', 'null'], 'items': {'type': 'string'}}, 'num_classes': {'type': ['integer', 'null'], 'minimum': 0}, 'modality': {'type': 'string'}, 'x_keys': {'type': 'array', 'items': {'type': 'string'}}, 'y_keys': {'type': 'array', 'items': {'type': 'string'}}, 'label_prefix': {'type': 'string'}, 'feature_shapes': {'type': 'object', 'additionalProperties': {'type': 'array', 'items': {'type': ['integer', 'null'], 'minimum': 0}}}, 'key_specs': {'type': 'array', 'items': {'type': 'object', 'required': ['key', 'role', 'dtype'], 'additionalProperties': False, 'properties': {'key': {'type': 'string', 'minLength': 1}, 'role': {'enum': ['x', 'y', 'meta']}, 'dtype': {'type': 'string'}, 'shape': {'oneOf': [{'type': 'null'}, {'$ref': '#/definitions/shape'}]}, 'layout': {'type': ['string', 'null']}, 'encoding': {'type': ['string', 'null']}, 'storage': {'type': 'string'}}}}, 'fields': {'type': 'array', 'items': {'type': 'object', 'required': ['name', 'kind', 'dtype', 'shape'], 'additionalProperties': False, 'properties': {'name': {'type': 'string', 'minLength': 1}, 'kind': {'enum': ['bytes', 'array', 'label']}, 'dtype': {'type': 'string'}, 'shape': {'$ref': '#/definitions/shape'}, 'optional': {'type': 'boolean'}, 'column': {'type': 'string'}}}}, 'spec_fingerprint': {'type': ['string', 'null']}, 'source_datasets': {'type': 'array', 'items': {'type': 'object', 'required': ['uri', 'kind', 'num_samples', 'fingerprint'], 'additionalProperties': False, 'properties': {'uri': {'type': 'string'}, 'kind': {'type': 'string'}, 'num_samples': {'type': 'integer', 'minimum': 0}, 'fingerprint': {'type': 'string'}}}}, 'source_fingerprint': {'type': 'string'}, 'split_method': {'enum': ['single', 'source', 'fractions']}, 'split_seed': {'type': ['integer', 'null']}, 'split_fractions': {'type': ['object', 'null'], 'propertyNames': {'description': 'a split name, which is one folder of the export', 'type': 'string', 'pattern': '^(?!\\.\\.?$)[^/\\\\\\x00-\\x1f\\x7f]{1,255}$'}, 'additionalProperties': {'type': 'number', 'minimum': 0, 'maximum': 1}}, 'shard_options': {'type': 'object'}, 'checksum_algorithm': {'enum': ['xxh3_64']}, 'metadata_file': {'oneOf': [{'type': 'null'}, {'$ref': '#/definitions/relpath'}]}, 'errors_file': {'oneOf': [{'type': 'null'}, {'$ref': '#/definitions/relpath'}]}, 'metadata_checksum': {'oneOf': [{'type': 'null'}, {'$ref': '#/definitions/checksum'}]}, 'errors_checksum': {'oneOf': [{'type': 'null'}, {'$ref': '#/definitions/checksum'}]}, 'num_skipped': {'type': 'integer', 'minimum': 0}, 'pipeline': {'type': 'array', 'items': {'type': 'object'}}, 'extra': {'type': 'object'}, 'splits': {'type': 'object', 'propertyNames': {'description': 'a split name, which is one folder of the export', 'type': 'string', 'pattern': '^(?!\\.\\.?$)[^/\\\\\\x00-\\x1f\\x7f]{1,255}$'}, 'additionalProperties': {'type': 'object', 'required': ['num_samples', 'num_bytes', 'shards'], 'additionalProperties': False, 'properties': {'num_samples': {'$ref': '#/definitions/count'}, 'num_bytes': {'$ref': '#/definitions/count'}, 'shards': {'type': 'array', 'items': {'$ref': '#/definitions/shard'}}, 'files': {'type': 'array', 'items': {'$ref': '#/definitions/relpath'}}, 'keys': {'$ref': '#/definitions/optional_relpath'}, 'index': {'type': ['object', 'null'], 'required': ['samples', 'keys'], 'additionalProperties': False, 'properties': {'samples': {'$ref': '#/definitions/relpath'}, 'keys': {'$ref': '#/definitions/relpath'}, 'members': {'$ref': '#/definitions/relpath'}}}}}}}, 'definitions': {'checksum': {'type': 'string', 'pattern': '^xxh3_64:[0-9a-f]{16}$'}, 'optional_checksum': {'oneOf': [{'type': 'null'}, {'type': 'string', 'pattern': '^xxh3_64:[0-9a-f]{16}$'}]}, 'count': {'type': 'integer', 'minimum': 0}, 'shape': {'type': 'array', 'items': {'type': ['integer', 'null'], 'minimum': 0}}, 'optional_relpath': {'oneOf': [{'type': 'null'}, {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}]}, 'relpath': {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}, 'split_name': {'description': 'a split name, which is one folder of the export', 'type': 'string', 'pattern': '^(?!\\.\\.?$)[^/\\\\\\x00-\\x1f\\x7f]{1,255}$'}, 'key_spec': {'type': 'object', 'required': ['key', 'role', 'dtype'], 'additionalProperties': False, 'properties': {'key': {'type': 'string', 'minLength': 1}, 'role': {'enum': ['x', 'y', 'meta']}, 'dtype': {'type': 'string'}, 'shape': {'oneOf': [{'type': 'null'}, {'type': 'array', 'items': {'type': ['integer', 'null'], 'minimum': 0}}]}, 'layout': {'type': ['string', 'null']}, 'encoding': {'type': ['string', 'null']}, 'storage': {'type': 'string'}}}, 'field': {'type': 'object', 'required': ['name', 'kind', 'dtype', 'shape'], 'additionalProperties': False, 'properties': {'name': {'type': 'string', 'minLength': 1}, 'kind': {'enum': ['bytes', 'array', 'label']}, 'dtype': {'type': 'string'}, 'shape': {'type': 'array', 'items': {'type': ['integer', 'null'], 'minimum': 0}}, 'optional': {'type': 'boolean'}, 'column': {'type': 'string'}}}, 'shard': {'type': 'object', 'required': ['path', 'num_samples', 'num_bytes', 'checksum'], 'additionalProperties': False, 'properties': {'path': {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}, 'num_samples': {'type': 'integer', 'minimum': 0}, 'num_bytes': {'type': 'integer', 'minimum': 0}, 'checksum': {'type': 'string', 'pattern': '^xxh3_64:[0-9a-f]{16}$'}, 'metadata': {'oneOf': [{'type': 'null'}, {'$ref': '#/definitions/relpath'}]}, 'dali_index': {'oneOf': [{'type': 'null'}, {'$ref': '#/definitions/relpath'}]}, 'metadata_checksum': {'oneOf': [{'type': 'null'}, {'$ref': '#/definitions/checksum'}]}}}, 'split': {'type': 'object', 'required': ['num_samples', 'num_bytes', 'shards'], 'additionalProperties': False, 'properties': {'num_samples': {'type': 'integer', 'minimum': 0}, 'num_bytes': {'type': 'integer', 'minimum': 0}, 'shards': {'type': 'array', 'items': {'type': 'object', 'required': ['path', 'num_samples', 'num_bytes', 'checksum'], 'additionalProperties': False, 'properties': {'path': {'$ref': '#/definitions/relpath'}, 'num_samples': {'$ref': '#/definitions/count'}, 'num_bytes': {'$ref': '#/definitions/count'}, 'checksum': {'$ref': '#/definitions/checksum'}, 'metadata': {'$ref': '#/definitions/optional_relpath'}, 'dali_index': {'$ref': '#/definitions/optional_relpath'}, 'metadata_checksum': {'$ref': '#/definitions/optional_checksum'}}}}, 'files': {'type': 'array', 'items': {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}}, 'keys': {'oneOf': [{'type': 'null'}, {'$ref': '#/definitions/relpath'}]}, 'index': {'type': ['object', 'null'], 'required': ['samples', 'keys'], 'additionalProperties': False, 'properties': {'samples': {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}, 'keys': {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}, 'members': {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}}}}}}}, rule='additionalProperties')
    return data

def validate___definitions_split(data, custom_formats={}, name_prefix=None):
    if not isinstance(data, (dict)):
        raise JsonSchemaValueException("" + (name_prefix or "data") + " must be object", value=data, name="" + (name_prefix or "data") + "", definition={'type': 'object', 'required': ['num_samples', 'num_bytes', 'shards'], 'additionalProperties': False, 'properties': {'num_samples': {'type': 'integer', 'minimum': 0}, 'num_bytes': {'type': 'integer', 'minimum': 0}, 'shards': {'type': 'array', 'items': {'type': 'object', 'required': ['path', 'num_samples', 'num_bytes', 'checksum'], 'additionalProperties': False, 'properties': {'path': {'$ref': '#/definitions/relpath'}, 'num_samples': {'$ref': '#/definitions/count'}, 'num_bytes': {'$ref': '#/definitions/count'}, 'checksum': {'$ref': '#/definitions/checksum'}, 'metadata': {'$ref': '#/definitions/optional_relpath'}, 'dali_index': {'$ref': '#/definitions/optional_relpath'}, 'metadata_checksum': {'$ref': '#/definitions/optional_checksum'}}}}, 'files': {'type': 'array', 'items': {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}}, 'keys': {'oneOf': [{'type': 'null'}, {'$ref': '#/definitions/relpath'}]}, 'index': {'type': ['object', 'null'], 'required': ['samples', 'keys'], 'additionalProperties': False, 'properties': {'samples': {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}, 'keys': {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}, 'members': {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}}}}}, rule='type')
    data_is_dict = isinstance(data, dict)
    if data_is_dict:
        data__missing_keys = set(['num_samples', 'num_bytes', 'shards']) - data.keys()
        if data__missing_keys:
            raise JsonSchemaValueException("" + (name_prefix or "data") + " must contain " + (str(sorted(data__missing_keys)) + " properties"), value=data, name="" + (name_prefix or "data") + "", definition={'type': 'object', 'required': ['num_samples', 'num_bytes', 'shards'], 'additionalProperties': False, 'properties': {'num_samples': {'type': 'integer', 'minimum': 0}, 'num_bytes': {'type': 'integer', 'minimum': 0}, 'shards': {'type': 'array', 'items': {'type': 'object', 'required': ['path', 'num_samples', 'num_bytes', 'checksum'], 'additionalProperties': False, 'properties': {'path': {'$ref': '#/definitions/relpath'}, 'num_samples': {'$ref': '#/definitions/count'}, 'num_bytes': {'$ref': '#/definitions/count'}, 'checksum': {'$ref': '#/definitions/checksum'}, 'metadata': {'$ref': '#/definitions/optional_relpath'}, 'dali_index': {'$ref': '#/definitions/optional_relpath'}, 'metadata_checksum': {'$ref': '#/definitions/optional_checksum'}}}}, 'files': {'type': 'array', 'items': {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}}, 'keys': {'oneOf': [{'type': 'null'}, {'$ref': '#/definitions/relpath'}]}, 'index': {'type': ['object', 'null'], 'required': ['samples', 'keys'], 'additionalProperties': False, 'properties': {'samples': {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}, 'keys': {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}, 'members': {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}}}}}, rule='required')
        data_keys = set(data.keys())
        if "num_samples" in data_keys:
            data_keys.remove("num_samples")
            data__numsamples = data["num_samples"]
            validate___definitions_count(data__numsamples, custom_formats, (name_prefix or "data") + ".num_samples")
        if "num_bytes" in data_keys:
            data_keys.remove("num_bytes")
            data__numbytes = data["num_bytes"]
            validate___definitions_count(data__numbytes, custom_formats, (name_prefix or "data") + ".num_bytes")
        if "shards" in data_keys:
            data_keys.remove("shards")
            data__shards = data["shards"]
            if not isinstance(data__shards, (list, tuple)):
                raise JsonSchemaValueException("" + (name_prefix or "data") + ".shards must be array", value=data__shards, name="" + (name_prefix or "data") + ".shards", definition={'type': 'array', 'items': {'type': 'object', 'required': ['path', 'num_samples', 'num_bytes', 'checksum'], 'additionalProperties': False, 'properties': {'path': {'$ref': '#/definitions/relpath'}, 'num_samples': {'$ref': '#/definitions/count'}, 'num_bytes': {'$ref': '#/definitions/count'}, 'checksum': {'$ref': '#/definitions/checksum'}, 'metadata': {'$ref': '#/definitions/optional_relpath'}, 'dali_index': {'$ref': '#/definitions/optional_relpath'}, 'metadata_checksum': {'$ref': '#/definitions/optional_checksum'}}}}, rule='type')
            data__shards_is_list = isinstance(data__shards, (list, tuple))
            if data__shards_is_list:
                data__shards_len = len(data__shards)
                for data__shards_x, data__shards_item in enumerate(data__shards):
                    validate___definitions_shard(data__shards_item, custom_formats, (name_prefix or "data") + ".shards[{data__shards_x}]".format(**locals()))
        if "files" in data_keys:
            data_keys.remove("files")
            data__files = data["files"]
            if not isinstance(data__files, (list, tuple)):
                raise JsonSchemaValueException("" + (name_prefix or "data") + ".files must be array", value=data__files, name="" + (name_prefix or "data") + ".files", definition={'type': 'array', 'items': {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}}, rule='type')
            data__files_is_list = isinstance(data__files, (list, tuple))
            if data__files_is_list:
                data__files_len = len(data__files)
                for data__files_x, data__files_item in enumerate(data__files):
                    validate___definitions_relpath(data__files_item, custom_formats, (name_prefix or "data") + ".files[{data__files_x}]".format(**locals()))
        if "keys" in data_keys:
            data_keys.remove("keys")
            data__keys = data["keys"]
            validate___definitions_optional_relpath(data__keys, custom_formats, (name_prefix or "data") + ".keys")
        if "index" in data_keys:
            data_keys.remove("index")
            data__index = data["index"]
            if not isinstance(data__index, (dict, NoneType)):
                raise JsonSchemaValueException("" + (name_prefix or "data") + ".index must be object or null", value=data__index, name="" + (name_prefix or "data") + ".index", definition={'type': ['object', 'null'], 'required': ['samples', 'keys'], 'additionalProperties': False, 'properties': {'samples': {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}, 'keys': {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}, 'members': {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}}}, rule='type')
            data__index_is_dict = isinstance(data__index, dict)
            if data__index_is_dict:
                data__index__missing_keys = set(['samples', 'keys']) - data__index.keys()
                if data__index__missing_keys:
                    raise JsonSchemaValueException("" + (name_prefix or "data") + ".index must contain " + (str(sorted(data__index__missing_keys)) + " properties"), value=data__index, name="" + (name_prefix or "data") + ".index", definition={'type': ['object', 'null'], 'required': ['samples', 'keys'], 'additionalProperties': False, 'properties': {'samples': {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}, 'keys': {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}, 'members': {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}}}, rule='required')
                data__index_keys = set(data__index.keys())
                if "samples" in data__index_keys:
                    data__index_keys.remove("samples")
                    data__index__samples = data__index["samples"]
                    validate___definitions_relpath(data__index__samples, custom_formats, (name_prefix or "data") + ".index.samples")
                if "keys" in data__index_keys:
                    data__index_keys.remove("keys")
                    data__index__keys = data__index["keys"]
                    validate___definitions_relpath(data__index__keys, custom_formats, (name_prefix or "data") + ".index.keys")
                if "members" in data__index_keys:
                    data__index_keys.remove("members")
                    data__index__members = data__index["members"]
                    validate___definitions_relpath(data__index__members, custom_formats, (name_prefix or "data") + ".index.members")
                if data__index_keys:
                    raise JsonSchemaValueException("" + (name_prefix or "data") + ".index must not contain "+str(data__index_keys)+" properties", value=data__index, name="" + (name_prefix or "data") + ".index", definition={'type': ['object', 'null'], 'required': ['samples', 'keys'], 'additionalProperties': False, 'properties': {'samples': {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}, 'keys': {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}, 'members': {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}}}, rule='additionalProperties')
        if data_keys:
            raise JsonSchemaValueException("" + (name_prefix or "data") + " must not contain "+str(data_keys)+" properties", value=data, name="" + (name_prefix or "data") + "", definition={'type': 'object', 'required': ['num_samples', 'num_bytes', 'shards'], 'additionalProperties': False, 'properties': {'num_samples': {'type': 'integer', 'minimum': 0}, 'num_bytes': {'type': 'integer', 'minimum': 0}, 'shards': {'type': 'array', 'items': {'type': 'object', 'required': ['path', 'num_samples', 'num_bytes', 'checksum'], 'additionalProperties': False, 'properties': {'path': {'$ref': '#/definitions/relpath'}, 'num_samples': {'$ref': '#/definitions/count'}, 'num_bytes': {'$ref': '#/definitions/count'}, 'checksum': {'$ref': '#/definitions/checksum'}, 'metadata': {'$ref': '#/definitions/optional_relpath'}, 'dali_index': {'$ref': '#/definitions/optional_relpath'}, 'metadata_checksum': {'$ref': '#/definitions/optional_checksum'}}}}, 'files': {'type': 'array', 'items': {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}}, 'keys': {'oneOf': [{'type': 'null'}, {'$ref': '#/definitions/relpath'}]}, 'index': {'type': ['object', 'null'], 'required': ['samples', 'keys'], 'additionalProperties': False, 'properties': {'samples': {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}, 'keys': {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}, 'members': {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}}}}}, rule='additionalProperties')
    return data

def validate___definitions_relpath(data, custom_formats={}, name_prefix=None):
    if not isinstance(data, (str)):
        raise JsonSchemaValueException("" + (name_prefix or "data") + " must be string", value=data, name="" + (name_prefix or "data") + "", definition={'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}, rule='type')
    if isinstance(data, str):
        if not REGEX_PATTERNS['^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'].search(data):
            raise JsonSchemaValueException("" + (name_prefix or "data") + " must match pattern ^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$", value=data, name="" + (name_prefix or "data") + "", definition={'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}, rule='pattern')
    return data

def validate___definitions_shard(data, custom_formats={}, name_prefix=None):
    if not isinstance(data, (dict)):
        raise JsonSchemaValueException("" + (name_prefix or "data") + " must be object", value=data, name="" + (name_prefix or "data") + "", definition={'type': 'object', 'required': ['path', 'num_samples', 'num_bytes', 'checksum'], 'additionalProperties': False, 'properties': {'path': {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}, 'num_samples': {'type': 'integer', 'minimum': 0}, 'num_bytes': {'type': 'integer', 'minimum': 0}, 'checksum': {'type': 'string', 'pattern': '^xxh3_64:[0-9a-f]{16}$'}, 'metadata': {'oneOf': [{'type': 'null'}, {'$ref': '#/definitions/relpath'}]}, 'dali_index': {'oneOf': [{'type': 'null'}, {'$ref': '#/definitions/relpath'}]}, 'metadata_checksum': {'oneOf': [{'type': 'null'}, {'$ref': '#/definitions/checksum'}]}}}, rule='type')
    data_is_dict = isinstance(data, dict)
    if data_is_dict:
        data__missing_keys = set(['path', 'num_samples', 'num_bytes', 'checksum']) - data.keys()
        if data__missing_keys:
            raise JsonSchemaValueException("" + (name_prefix or "data") + " must contain " + (str(sorted(data__missing_keys)) + " properties"), value=data, name="" + (name_prefix or "data") + "", definition={'type': 'object', 'required': ['path', 'num_samples', 'num_bytes', 'checksum'], 'additionalProperties': False, 'properties': {'path': {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}, 'num_samples': {'type': 'integer', 'minimum': 0}, 'num_bytes': {'type': 'integer', 'minimum': 0}, 'checksum': {'type': 'string', 'pattern': '^xxh3_64:[0-9a-f]{16}$'}, 'metadata': {'oneOf': [{'type': 'null'}, {'$ref': '#/definitions/relpath'}]}, 'dali_index': {'oneOf': [{'type': 'null'}, {'$ref': '#/definitions/relpath'}]}, 'metadata_checksum': {'oneOf': [{'type': 'null'}, {'$ref': '#/definitions/checksum'}]}}}, rule='required')
        data_keys = set(data.keys())
        if "path" in data_keys:
            data_keys.remove("path")
            data__path = data["path"]
            validate___definitions_relpath(data__path, custom_formats, (name_prefix or "data") + ".path")
        if "num_samples" in data_keys:
            data_keys.remove("num_samples")
            data__numsamples = data["num_samples"]
            validate___definitions_count(data__numsamples, custom_formats, (name_prefix or "data") + ".num_samples")
        if "num_bytes" in data_keys:
            data_keys.remove("num_bytes")
            data__numbytes = data["num_bytes"]
            validate___definitions_count(data__numbytes, custom_formats, (name_prefix or "data") + ".num_bytes")
        if "checksum" in data_keys:
            data_keys.remove("checksum")
            data__checksum = data["checksum"]
            validate___definitions_checksum(data__checksum, custom_formats, (name_prefix or "data") + ".checksum")
        if "metadata" in data_keys:
            data_keys.remove("metadata")
            data__metadata = data["metadata"]
            validate___definitions_optional_relpath(data__metadata, custom_formats, (name_prefix or "data") + ".metadata")
        if "dali_index" in data_keys:
            data_keys.remove("dali_index")
            data__daliindex = data["dali_index"]
            validate___definitions_optional_relpath(data__daliindex, custom_formats, (name_prefix or "data") + ".dali_index")
        if "metadata_checksum" in data_keys:
            data_keys.remove("metadata_checksum")
            data__metadatachecksum = data["metadata_checksum"]
            validate___definitions_optional_checksum(data__metadatachecksum, custom_formats, (name_prefix or "data") + ".metadata_checksum")
        if data_keys:
            raise JsonSchemaValueException("" + (name_prefix or "data") + " must not contain "+str(data_keys)+" properties", value=data, name="" + (name_prefix or "data") + "", definition={'type': 'object', 'required': ['path', 'num_samples', 'num_bytes', 'checksum'], 'additionalProperties': False, 'properties': {'path': {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}, 'num_samples': {'type': 'integer', 'minimum': 0}, 'num_bytes': {'type': 'integer', 'minimum': 0}, 'checksum': {'type': 'string', 'pattern': '^xxh3_64:[0-9a-f]{16}$'}, 'metadata': {'oneOf': [{'type': 'null'}, {'$ref': '#/definitions/relpath'}]}, 'dali_index': {'oneOf': [{'type': 'null'}, {'$ref': '#/definitions/relpath'}]}, 'metadata_checksum': {'oneOf': [{'type': 'null'}, {'$ref': '#/definitions/checksum'}]}}}, rule='additionalProperties')
    return data

def validate___definitions_checksum(data, custom_formats={}, name_prefix=None):
    if not isinstance(data, (str)):
        raise JsonSchemaValueException("" + (name_prefix or "data") + " must be string", value=data, name="" + (name_prefix or "data") + "", definition={'type': 'string', 'pattern': '^xxh3_64:[0-9a-f]{16}$'}, rule='type')
    if isinstance(data, str):
        if not REGEX_PATTERNS['^xxh3_64:[0-9a-f]{16}$'].search(data):
            raise JsonSchemaValueException("" + (name_prefix or "data") + " must match pattern ^xxh3_64:[0-9a-f]{16}$", value=data, name="" + (name_prefix or "data") + "", definition={'type': 'string', 'pattern': '^xxh3_64:[0-9a-f]{16}$'}, rule='pattern')
    return data

def validate___definitions_optional_checksum(data, custom_formats={}, name_prefix=None):
    data_one_of_count1 = 0
    if data_one_of_count1 < 2:
        try:
            if not isinstance(data, (NoneType)):
                raise JsonSchemaValueException("" + (name_prefix or "data") + " must be null", value=data, name="" + (name_prefix or "data") + "", definition={'type': 'null'}, rule='type')
            data_one_of_count1 += 1
        except (JsonSchemaValueException, JsonSchemaValuesException): pass
    if data_one_of_count1 < 2:
        try:
            validate___definitions_checksum(data, custom_formats, (name_prefix or "data") + "")
            data_one_of_count1 += 1
        except (JsonSchemaValueException, JsonSchemaValuesException): pass
    if data_one_of_count1 != 1:
        raise JsonSchemaValueException("" + (name_prefix or "data") + " must be valid exactly by one definition" + (" (" + str(data_one_of_count1) + " matches found)"), value=data, name="" + (name_prefix or "data") + "", definition={'oneOf': [{'type': 'null'}, {'type': 'string', 'pattern': '^xxh3_64:[0-9a-f]{16}$'}]}, rule='oneOf')
    return data

def validate___definitions_optional_relpath(data, custom_formats={}, name_prefix=None):
    data_one_of_count2 = 0
    if data_one_of_count2 < 2:
        try:
            if not isinstance(data, (NoneType)):
                raise JsonSchemaValueException("" + (name_prefix or "data") + " must be null", value=data, name="" + (name_prefix or "data") + "", definition={'type': 'null'}, rule='type')
            data_one_of_count2 += 1
        except (JsonSchemaValueException, JsonSchemaValuesException): pass
    if data_one_of_count2 < 2:
        try:
            validate___definitions_relpath(data, custom_formats, (name_prefix or "data") + "")
            data_one_of_count2 += 1
        except (JsonSchemaValueException, JsonSchemaValuesException): pass
    if data_one_of_count2 != 1:
        raise JsonSchemaValueException("" + (name_prefix or "data") + " must be valid exactly by one definition" + (" (" + str(data_one_of_count2) + " matches found)"), value=data, name="" + (name_prefix or "data") + "", definition={'oneOf': [{'type': 'null'}, {'description': "a normalised path inside the export (relative, '/'-separated, no empty, '.' or '..' part, no backslash or control character)", 'type': 'string', 'pattern': '^(?!\\.\\.?(/|$))(?!.*/\\.\\.?(/|$))[^/\\\\\\x00-\\x1f\\x7f]+(/[^/\\\\\\x00-\\x1f\\x7f]+)*$'}]}, rule='oneOf')
    return data

def validate___definitions_split_name(data, custom_formats={}, name_prefix=None):
    if not isinstance(data, (str)):
        raise JsonSchemaValueException("" + (name_prefix or "data") + " must be string", value=data, name="" + (name_prefix or "data") + "", definition={'description': 'a split name, which is one folder of the export', 'type': 'string', 'pattern': '^(?!\\.\\.?$)[^/\\\\\\x00-\\x1f\\x7f]{1,255}$'}, rule='type')
    if isinstance(data, str):
        if not REGEX_PATTERNS['^(?!\\.\\.?$)[^/\\\\\\x00-\\x1f\\x7f]{1,255}$'].search(data):
            raise JsonSchemaValueException("" + (name_prefix or "data") + " must match pattern ^(?!\\.\\.?$)[^/\\\\\\x00-\\x1f\\x7f]{1,255}$", value=data, name="" + (name_prefix or "data") + "", definition={'description': 'a split name, which is one folder of the export', 'type': 'string', 'pattern': '^(?!\\.\\.?$)[^/\\\\\\x00-\\x1f\\x7f]{1,255}$'}, rule='pattern')
    return data

def validate___definitions_field(data, custom_formats={}, name_prefix=None):
    if not isinstance(data, (dict)):
        raise JsonSchemaValueException("" + (name_prefix or "data") + " must be object", value=data, name="" + (name_prefix or "data") + "", definition={'type': 'object', 'required': ['name', 'kind', 'dtype', 'shape'], 'additionalProperties': False, 'properties': {'name': {'type': 'string', 'minLength': 1}, 'kind': {'enum': ['bytes', 'array', 'label']}, 'dtype': {'type': 'string'}, 'shape': {'type': 'array', 'items': {'type': ['integer', 'null'], 'minimum': 0}}, 'optional': {'type': 'boolean'}, 'column': {'type': 'string'}}}, rule='type')
    data_is_dict = isinstance(data, dict)
    if data_is_dict:
        data__missing_keys = set(['name', 'kind', 'dtype', 'shape']) - data.keys()
        if data__missing_keys:
            raise JsonSchemaValueException("" + (name_prefix or "data") + " must contain " + (str(sorted(data__missing_keys)) + " properties"), value=data, name="" + (name_prefix or "data") + "", definition={'type': 'object', 'required': ['name', 'kind', 'dtype', 'shape'], 'additionalProperties': False, 'properties': {'name': {'type': 'string', 'minLength': 1}, 'kind': {'enum': ['bytes', 'array', 'label']}, 'dtype': {'type': 'string'}, 'shape': {'type': 'array', 'items': {'type': ['integer', 'null'], 'minimum': 0}}, 'optional': {'type': 'boolean'}, 'column': {'type': 'string'}}}, rule='required')
        data_keys = set(data.keys())
        if "name" in data_keys:
            data_keys.remove("name")
            data__name = data["name"]
            if not isinstance(data__name, (str)):
                raise JsonSchemaValueException("" + (name_prefix or "data") + ".name must be string", value=data__name, name="" + (name_prefix or "data") + ".name", definition={'type': 'string', 'minLength': 1}, rule='type')
            if isinstance(data__name, str):
                data__name_len = len(data__name)
                if data__name_len < 1:
                    raise JsonSchemaValueException("" + (name_prefix or "data") + ".name must be longer than or equal to 1 characters", value=data__name, name="" + (name_prefix or "data") + ".name", definition={'type': 'string', 'minLength': 1}, rule='minLength')
        if "kind" in data_keys:
            data_keys.remove("kind")
            data__kind = data["kind"]
            if not (isinstance(data__kind, str) and data__kind == 'bytes' or isinstance(data__kind, str) and data__kind == 'array' or isinstance(data__kind, str) and data__kind == 'label'):
                raise JsonSchemaValueException("" + (name_prefix or "data") + ".kind must be one of ['bytes', 'array', 'label']", value=data__kind, name="" + (name_prefix or "data") + ".kind", definition={'enum': ['bytes', 'array', 'label']}, rule='enum')
        if "dtype" in data_keys:
            data_keys.remove("dtype")
            data__dtype = data["dtype"]
            if not isinstance(data__dtype, (str)):
                raise JsonSchemaValueException("" + (name_prefix or "data") + ".dtype must be string", value=data__dtype, name="" + (name_prefix or "data") + ".dtype", definition={'type': 'string'}, rule='type')
        if "shape" in data_keys:
            data_keys.remove("shape")
            data__shape = data["shape"]
            validate___definitions_shape(data__shape, custom_formats, (name_prefix or "data") + ".shape")
        if "optional" in data_keys:
            data_keys.remove("optional")
            data__optional = data["optional"]
            if not isinstance(data__optional, (bool)):
                raise JsonSchemaValueException("" + (name_prefix or "data") + ".optional must be boolean", value=data__optional, name="" + (name_prefix or "data") + ".optional", definition={'type': 'boolean'}, rule='type')
        if "column" in data_keys:
            data_keys.remove("column")
            data__column = data["column"]
            if not isinstance(data__column, (str)):
                raise JsonSchemaValueException("" + (name_prefix or "data") + ".column must be string", value=data__column, name="" + (name_prefix or "data") + ".column", definition={'type': 'string'}, rule='type')
        if data_keys:
            raise JsonSchemaValueException("" + (name_prefix or "data") + " must not contain "+str(data_keys)+" properties", value=data, name="" + (name_prefix or "data") + "", definition={'type': 'object', 'required': ['name', 'kind', 'dtype', 'shape'], 'additionalProperties': False, 'properties': {'name': {'type': 'string', 'minLength': 1}, 'kind': {'enum': ['bytes', 'array', 'label']}, 'dtype': {'type': 'string'}, 'shape': {'type': 'array', 'items': {'type': ['integer', 'null'], 'minimum': 0}}, 'optional': {'type': 'boolean'}, 'column': {'type': 'string'}}}, rule='additionalProperties')
    return data

def validate___definitions_key_spec(data, custom_formats={}, name_prefix=None):
    if not isinstance(data, (dict)):
        raise JsonSchemaValueException("" + (name_prefix or "data") + " must be object", value=data, name="" + (name_prefix or "data") + "", definition={'type': 'object', 'required': ['key', 'role', 'dtype'], 'additionalProperties': False, 'properties': {'key': {'type': 'string', 'minLength': 1}, 'role': {'enum': ['x', 'y', 'meta']}, 'dtype': {'type': 'string'}, 'shape': {'oneOf': [{'type': 'null'}, {'type': 'array', 'items': {'type': ['integer', 'null'], 'minimum': 0}}]}, 'layout': {'type': ['string', 'null']}, 'encoding': {'type': ['string', 'null']}, 'storage': {'type': 'string'}}}, rule='type')
    data_is_dict = isinstance(data, dict)
    if data_is_dict:
        data__missing_keys = set(['key', 'role', 'dtype']) - data.keys()
        if data__missing_keys:
            raise JsonSchemaValueException("" + (name_prefix or "data") + " must contain " + (str(sorted(data__missing_keys)) + " properties"), value=data, name="" + (name_prefix or "data") + "", definition={'type': 'object', 'required': ['key', 'role', 'dtype'], 'additionalProperties': False, 'properties': {'key': {'type': 'string', 'minLength': 1}, 'role': {'enum': ['x', 'y', 'meta']}, 'dtype': {'type': 'string'}, 'shape': {'oneOf': [{'type': 'null'}, {'type': 'array', 'items': {'type': ['integer', 'null'], 'minimum': 0}}]}, 'layout': {'type': ['string', 'null']}, 'encoding': {'type': ['string', 'null']}, 'storage': {'type': 'string'}}}, rule='required')
        data_keys = set(data.keys())
        if "key" in data_keys:
            data_keys.remove("key")
            data__key = data["key"]
            if not isinstance(data__key, (str)):
                raise JsonSchemaValueException("" + (name_prefix or "data") + ".key must be string", value=data__key, name="" + (name_prefix or "data") + ".key", definition={'type': 'string', 'minLength': 1}, rule='type')
            if isinstance(data__key, str):
                data__key_len = len(data__key)
                if data__key_len < 1:
                    raise JsonSchemaValueException("" + (name_prefix or "data") + ".key must be longer than or equal to 1 characters", value=data__key, name="" + (name_prefix or "data") + ".key", definition={'type': 'string', 'minLength': 1}, rule='minLength')
        if "role" in data_keys:
            data_keys.remove("role")
            data__role = data["role"]
            if not (isinstance(data__role, str) and data__role == 'x' or isinstance(data__role, str) and data__role == 'y' or isinstance(data__role, str) and data__role == 'meta'):
                raise JsonSchemaValueException("" + (name_prefix or "data") + ".role must be one of ['x', 'y', 'meta']", value=data__role, name="" + (name_prefix or "data") + ".role", definition={'enum': ['x', 'y', 'meta']}, rule='enum')
        if "dtype" in data_keys:
            data_keys.remove("dtype")
            data__dtype = data["dtype"]
            if not isinstance(data__dtype, (str)):
                raise JsonSchemaValueException("" + (name_prefix or "data") + ".dtype must be string", value=data__dtype, name="" + (name_prefix or "data") + ".dtype", definition={'type': 'string'}, rule='type')
        if "shape" in data_keys:
            data_keys.remove("shape")
            data__shape = data["shape"]
            data__shape_one_of_count3 = 0
            if data__shape_one_of_count3 < 2:
                try:
                    if not isinstance(data__shape, (NoneType)):
                        raise JsonSchemaValueException("" + (name_prefix or "data") + ".shape must be null", value=data__shape, name="" + (name_prefix or "data") + ".shape", definition={'type': 'null'}, rule='type')
                    data__shape_one_of_count3 += 1
                except (JsonSchemaValueException, JsonSchemaValuesException): pass
            if data__shape_one_of_count3 < 2:
                try:
                    validate___definitions_shape(data__shape, custom_formats, (name_prefix or "data") + ".shape")
                    data__shape_one_of_count3 += 1
                except (JsonSchemaValueException, JsonSchemaValuesException): pass
            if data__shape_one_of_count3 != 1:
                raise JsonSchemaValueException("" + (name_prefix or "data") + ".shape must be valid exactly by one definition" + (" (" + str(data__shape_one_of_count3) + " matches found)"), value=data__shape, name="" + (name_prefix or "data") + ".shape", definition={'oneOf': [{'type': 'null'}, {'type': 'array', 'items': {'type': ['integer', 'null'], 'minimum': 0}}]}, rule='oneOf')
        if "layout" in data_keys:
            data_keys.remove("layout")
            data__layout = data["layout"]
            if not isinstance(data__layout, (str, NoneType)):
                raise JsonSchemaValueException("" + (name_prefix or "data") + ".layout must be string or null", value=data__layout, name="" + (name_prefix or "data") + ".layout", definition={'type': ['string', 'null']}, rule='type')
        if "encoding" in data_keys:
            data_keys.remove("encoding")
            data__encoding = data["encoding"]
            if not isinstance(data__encoding, (str, NoneType)):
                raise JsonSchemaValueException("" + (name_prefix or "data") + ".encoding must be string or null", value=data__encoding, name="" + (name_prefix or "data") + ".encoding", definition={'type': ['string', 'null']}, rule='type')
        if "storage" in data_keys:
            data_keys.remove("storage")
            data__storage = data["storage"]
            if not isinstance(data__storage, (str)):
                raise JsonSchemaValueException("" + (name_prefix or "data") + ".storage must be string", value=data__storage, name="" + (name_prefix or "data") + ".storage", definition={'type': 'string'}, rule='type')
        if data_keys:
            raise JsonSchemaValueException("" + (name_prefix or "data") + " must not contain "+str(data_keys)+" properties", value=data, name="" + (name_prefix or "data") + "", definition={'type': 'object', 'required': ['key', 'role', 'dtype'], 'additionalProperties': False, 'properties': {'key': {'type': 'string', 'minLength': 1}, 'role': {'enum': ['x', 'y', 'meta']}, 'dtype': {'type': 'string'}, 'shape': {'oneOf': [{'type': 'null'}, {'type': 'array', 'items': {'type': ['integer', 'null'], 'minimum': 0}}]}, 'layout': {'type': ['string', 'null']}, 'encoding': {'type': ['string', 'null']}, 'storage': {'type': 'string'}}}, rule='additionalProperties')
    return data

def validate___definitions_shape(data, custom_formats={}, name_prefix=None):
    if not isinstance(data, (list, tuple)):
        raise JsonSchemaValueException("" + (name_prefix or "data") + " must be array", value=data, name="" + (name_prefix or "data") + "", definition={'type': 'array', 'items': {'type': ['integer', 'null'], 'minimum': 0}}, rule='type')
    data_is_list = isinstance(data, (list, tuple))
    if data_is_list:
        data_len = len(data)
        for data_x, data_item in enumerate(data):
            if not isinstance(data_item, (int, NoneType)) and not (isinstance(data_item, float) and data_item.is_integer()) or isinstance(data_item, bool):
                raise JsonSchemaValueException("" + (name_prefix or "data") + "[{data_x}]".format(**locals()) + " must be integer or null", value=data_item, name="" + (name_prefix or "data") + "[{data_x}]".format(**locals()) + "", definition={'type': ['integer', 'null'], 'minimum': 0}, rule='type')
            if isinstance(data_item, (int, float)) and not isinstance(data_item, bool):
                if data_item < 0:
                    raise JsonSchemaValueException("" + (name_prefix or "data") + "[{data_x}]".format(**locals()) + " must be bigger than or equal to 0", value=data_item, name="" + (name_prefix or "data") + "[{data_x}]".format(**locals()) + "", definition={'type': ['integer', 'null'], 'minimum': 0}, rule='minimum')
    return data

def validate___definitions_count(data, custom_formats={}, name_prefix=None):
    if not isinstance(data, (int)) and not (isinstance(data, float) and data.is_integer()) or isinstance(data, bool):
        raise JsonSchemaValueException("" + (name_prefix or "data") + " must be integer", value=data, name="" + (name_prefix or "data") + "", definition={'type': 'integer', 'minimum': 0}, rule='type')
    if isinstance(data, (int, float)) and not isinstance(data, bool):
        if data < 0:
            raise JsonSchemaValueException("" + (name_prefix or "data") + " must be bigger than or equal to 0", value=data, name="" + (name_prefix or "data") + "", definition={'type': 'integer', 'minimum': 0}, rule='minimum')
    return data