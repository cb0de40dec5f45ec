"""What every mds tool needs, once: the command-line dialect (`mds_common.cli`, docs/cli.md), flags
declared on config dataclasses (`mds_common.flags`), atomic outputs (`mds_common.files`), progress
(`mds_common.progress`), the JSON sidecars written beside outputs (`mds_common.sidecar`) and the
record of a tokenizer (`mds_common.tokenizer_record`).

Nothing is imported here, so that `import mds_common.files` stays free of typer.
"""
