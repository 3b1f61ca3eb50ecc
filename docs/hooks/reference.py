"""A MkDocs hook: the reference pages, generated from the code at every build.

Registered under ``hooks:`` in ``mkdocs.yml``. Each page is written from the code's own
lists, so a field, route, command or setting added without documentation shows up here
(with its docstring, or without one) and cannot drift from what the service does:

- ``reference/spec.md``: every job-spec field, from the pydantic models' JSON schema
  (``JobSpec.model_json_schema()``: types, defaults, bounds, docstrings, nested models);
- ``reference/api.md``: every path and method of the FastAPI app's OpenAPI schema;
- ``reference/cli.md``: every ``amptrain`` command, subcommand and option (click);
- ``reference/settings.md``: every ``AMPTRAIN_*`` setting (pydantic-settings);
- ``reference/metrics.md``: the one table of metric definitions (``contract/metrics.py``).

The hook imports the package it documents from the checkout that holds ``mkdocs.yml``.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import click
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PAGES = ("spec", "api", "cli", "settings", "metrics")
"""The generated pages, ``reference/<name>.md``."""


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for name in PAGES:
        content = globals()[f"{name}_page"]()
        files.append(File.generated(config, f"reference/{name}.md", content=content))
    return files


# ---- text ---------------------------------------------------------------------------

_ROLE = re.compile(r":(?:class|func|attr|mod|data|meth):`~?([^`]+)`")


def plain(text: str | None) -> str:
    """A docstring as one Markdown table cell: reST roles and ``literals`` as code,
    lines joined, pipes escaped."""
    if not text:
        return ""
    text = _ROLE.sub(lambda m: f"`{m[1].rsplit('.', 1)[-1]}`", text)
    text = text.replace("``", "`")
    text = " ".join(line.strip() for line in text.strip().splitlines())
    return text.replace("|", "\\|")


def code(value: Any) -> str:
    shown = json.dumps(value)
    return "`" + shown.replace("|", "\\|").replace("`", "'") + "`"


# ---- the job spec -------------------------------------------------------------------


def schema_type(prop: dict[str, Any]) -> str:
    """A JSON-schema property's type as text, nested models as links to their section."""
    if "$ref" in prop:
        name = prop["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "enum" in prop:
        return " \\| ".join(code(v) for v in prop["enum"])
    if "const" in prop:
        return code(prop["const"])
    for key in ("anyOf", "oneOf"):
        if key in prop:
            return " \\| ".join(schema_type(p) for p in prop[key])
    kind = prop.get("type", "any")
    if kind == "array":
        if "prefixItems" in prop:
            return "[" + ", ".join(schema_type(p) for p in prop["prefixItems"]) + "]"
        return f"list of {schema_type(prop.get('items', {}))}"
    if kind == "object" and isinstance(prop.get("additionalProperties"), dict):
        return f"map of {schema_type(prop['additionalProperties'])}"
    return str(kind)


_BOUNDS = (
    ("minimum", ">= {}"),
    ("exclusiveMinimum", "> {}"),
    ("maximum", "<= {}"),
    ("exclusiveMaximum", "< {}"),
    ("minLength", "length >= {}"),
    ("maxLength", "length <= {}"),
    ("minItems", "at least {} items"),
    ("maxItems", "at most {} items"),
    ("maxProperties", "at most {} entries"),
    ("pattern", "matches `{}`"),
)


def bounds(prop: dict[str, Any]) -> str:
    found = []
    for part in (prop, *prop.get("anyOf", ())):
        for key, text in _BOUNDS:
            if key in part:
                found.append(text.format(part[key]))
    return ", ".join(found)


def model_section(title: str, model: dict[str, Any]) -> list[str]:
    lines = [f"## {title}", ""]
    if model.get("description"):
        lines += [plain(model["description"]), ""]
    required = set(model.get("required", ()))
    lines += ["| field | type | default | bounds | description |", "|---|---|---|---|---|"]
    for name, prop in model.get("properties", {}).items():
        default = "required" if name in required else code(prop.get("default"))
        if name not in required and "default" not in prop:
            default = "its fields' defaults" if "$ref" in prop else "(computed)"
        lines.append(
            f"| `{name}` | {schema_type(prop)} | {default} | {bounds(prop)} | "
            f"{plain(prop.get('description'))} |"
        )
    return [*lines, ""]


def spec_page() -> str:
    from amptrain.contract.spec import JobSpec

    schema = JobSpec.model_json_schema()
    lines = [
        "# Job spec",
        "",
        "Every field a job spec may hold, generated from the pydantic models in",
        "`amptrain/contract/spec.py` (and the models it nests) at each build of this site.",
        "Unknown fields are refused; every number has the bounds shown (a value outside is",
        "a `422` naming the field). A spec is JSON (`POST /jobs`) or a YAML/JSON file",
        "(`amptrain submit FILE`, `amptrain train FILE`).",
        "",
        *model_section("JobSpec", schema),
    ]
    for name, model in sorted(schema.get("$defs", {}).items()):
        lines += model_section(name, model)
    return "\n".join(lines)


# ---- the HTTP API -------------------------------------------------------------------


def openapi_schema() -> dict[str, Any]:
    from amptrain.core.settings import Settings
    from amptrain.server.web.app import create_app

    with tempfile.TemporaryDirectory() as data_dir:  # nothing is started or written
        return create_app(Settings(data_dir=Path(data_dir))).openapi()


def api_page() -> str:
    schema = openapi_schema()
    lines = [
        "# HTTP API",
        "",
        "Every route of the API, generated from the FastAPI app's OpenAPI schema at each",
        "build of this site. A running service serves the same schema at `/openapi.json`",
        "and browsable at `/docs` (Swagger UI) and `/redoc`. Every route but the health",
        "checks and `/metrics` needs `Authorization: Bearer TOKEN`; errors are",
        '`{"error": CODE, "detail": ...}`. The live streams (`WS /jobs/{id}/ws`) are',
        "described in [the data path](../concepts/data-path.md).",
        "",
    ]
    for path, methods in schema["paths"].items():
        for method, op in methods.items():
            lines += [f"## `{method.upper()} {path}`", ""]
            if op.get("summary"):
                lines += [f"**{plain(op['summary'])}**", ""]
            if op.get("description"):
                lines += [plain(op["description"]), ""]
            params = op.get("parameters", [])
            if params:
                lines += [
                    "| parameter | in | type | required | description |",
                    "|---|---|---|---|---|",
                ]
                for p in params:
                    lines.append(
                        f"| `{p['name']}` | {p['in']} | {schema_type(p.get('schema', {}))} | "
                        f"{'yes' if p.get('required') else 'no'} | {plain(p.get('description'))} |"
                    )
                lines.append("")
            body = op.get("requestBody", {}).get("content", {})
            for media, content in body.items():
                ref = content.get("schema", {}).get("$ref", "")
                shown = ref.rsplit("/", 1)[-1] or schema_type(content.get("schema", {}))
                lines += [f"Body: `{media}`, `{shown}`.", ""]
            lines += ["| status | meaning |", "|---|---|"]
            for status, response in op.get("responses", {}).items():
                lines.append(f"| `{status}` | {plain(response.get('description'))} |")
            lines.append("")
    return "\n".join(lines)


# ---- the command line ---------------------------------------------------------------


def cli_commands() -> dict[str, click.Command]:
    """Every top-level ``amptrain`` command, loaded as ``amptrain NAME`` loads it."""
    from amptrain.cli.main import COMMANDS

    loaded = {}
    for name, lazy in sorted(COMMANDS.items()):
        module, attr = lazy.target.split(":")
        loaded[name] = getattr(importlib.import_module(module), attr)
    return loaded


def command_section(path: str, command: click.Command, level: int) -> list[str]:
    ctx = click.Context(command, info_name=path)
    usage = " ".join(command.collect_usage_pieces(ctx))
    lines = [f"{'#' * level} `{path}`", "", f"    {path} {usage}", ""]
    if command.help:
        lines += [plain(command.help.split("\f")[0]), ""]
    rows = []
    for param in command.get_params(ctx):
        if isinstance(param, click.Argument):
            rows.append(f"| `{param.human_readable_name}` | argument | |")
            continue
        record = param.get_help_record(ctx)
        if record is not None:
            opts, help_text = record
            rows.append(f"| `{opts}` | option | {plain(help_text)} |")
    if rows:
        lines += ["| name | kind | help |", "|---|---|---|", *rows, ""]
    if isinstance(command, click.Group):
        for name, sub in sorted(command.commands.items()):
            lines += command_section(f"{path} {name}", sub, min(level + 1, 4))
    return lines


def cli_page() -> str:
    from amptrain.cli.main import COMMANDS

    lines = [
        "# Command line",
        "",
        "Every `amptrain` command, subcommand and option, generated from the click",
        "commands at each build of this site (`amptrain COMMAND --help` prints the same).",
        "A command whose packages are not installed says which extra to install.",
        "",
        "| command | what | extra |",
        "|---|---|---|",
    ]
    for name, lazy in sorted(COMMANDS.items()):
        lines.append(
            f"| [`amptrain {name}`](#amptrain-{name}) | {plain(lazy.help)} | `{lazy.extra}` |"
        )
    lines.append("")
    for name, command in cli_commands().items():
        lines += command_section(f"amptrain {name}", command, 2)
    return "\n".join(lines)


# ---- the settings -------------------------------------------------------------------


def settings_page() -> str:
    from amptrain.core.settings import Settings

    lines = [
        "# Settings",
        "",
        "Every setting of the service, generated from `amptrain/core/settings.py` at each",
        "build of this site. Each is read from the environment variable shown; paths left",
        "unset derive from `AMPTRAIN_DATA_DIR`. A bad value stops the process with an",
        "error naming the setting.",
        "",
        "| variable | type | default | description |",
        "|---|---|---|---|",
    ]
    for name, field in Settings.model_fields.items():
        default = field.get_default(call_default_factory=True)
        shown = "unset" if default in (None, "") else code(_jsonable(default))
        kind = getattr(field.annotation, "__name__", None) or str(field.annotation)
        kind = kind.replace("typing.", "").replace("|", "\\|")
        lines.append(
            f"| `AMPTRAIN_{name.upper()}` | `{kind}` | {shown} | {plain(field.description)} |"
        )
    return "\n".join(lines) + "\n"


def _jsonable(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


# ---- the metrics --------------------------------------------------------------------


def metrics_page() -> str:
    from amptrain.contract.metrics import CHARTS, EVAL_METRICS, STEP_METRICS

    charts = {c.key: c.title for c in CHARTS}
    lines = [
        "# Metrics",
        "",
        "The one table of metric definitions (`amptrain/contract/metrics.py`), generated at",
        "each build of this site. Records, the stream, the SQL columns, the job summary,",
        "`GET /catalog`, the dashboard's charts and both command lines follow from it.",
        "",
        "## Step metrics",
        "",
        "| name | type | unit | chart | in summary | extremes kept | description |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in STEP_METRICS:
        lines.append(
            f"| `{m.name}` | {m.type} | {m.unit} | {charts.get(m.chart or '', '')} | "
            f"{'yes' if m.summary else ''} | {'yes' if m.extremes else ''} | {plain(m.doc)} |"
        )
    lines += [
        "",
        "## Evaluation metrics",
        "",
        "Built-in names a job's `eval.metrics` may ask for; plugins add their own",
        "(see [your own model](../tutorials/plugins.md)).",
        "",
        "| name | better | description |",
        "|---|---|---|",
    ]
    for m in EVAL_METRICS:
        lines.append(f"| `{m.name}` | {m.better or ''} | {plain(m.doc)} |")
    return "\n".join(lines) + "\n"
