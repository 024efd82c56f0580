"""Reasoning traces: the record schema, the strict JSONL reader, one importer per source
format, and dataset directories with manifests and id-hash splits.

    schema.py     Trace (pydantic, strict) and RecordError
    reader.py     scan / read_traces: bytes in, every bad line as FILE:LINE: FIELD: reason
    importers.py  record | gsm8k | traces (older format) | generic → Trace
    dataset.py    import_dataset, load_dataset, Dataset.split, list_datasets
    cli.py        `tunix-rt data import | validate | list | show | render`
"""
