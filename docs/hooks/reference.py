"""MkDocs hook: renders the reference pages' generated parts from the code, so they cannot drift.

`<!-- generated: cli -->` becomes every `digest` subcommand from `digest_pipeline.cli.build_parser()`;
`<!-- generated: settings -->` becomes the table of `digest_pipeline.settings_catalogue`;
`<!-- generated: component -->` becomes the attributes of the `WeeklyDigest` component's model.
"""

import argparse
from typing import Any

from digest_pipeline.cli import build_parser
from digest_pipeline.settings_catalogue import render_markdown

CLI_MARKER = "<!-- generated: cli -->"
SETTINGS_MARKER = "<!-- generated: settings -->"
COMPONENT_MARKER = "<!-- generated: component -->"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _argument(action: argparse.Action) -> str:
    if action.option_strings:
        flag = ", ".join(f"`{o}`" for o in action.option_strings)
    else:
        flag = f"`{action.metavar or action.dest}`"
    if action.metavar and action.option_strings:
        flag += f" `{action.metavar}`"
    notes = []
    if action.required:
        notes.append("required")
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        notes.append("one of " + ", ".join(f"`{c}`" for c in action.choices))
    return f"| {flag} | {_cell(action.help or '')} | {'; '.join(notes)} |"


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            return [(name, helps.get(name, ""), sub) for name, sub in action.choices.items()]
    return []


def _usage(sub: argparse.ArgumentParser) -> str:
    # a fixed width, so the page does not depend on the terminal that builds it
    formatter = argparse.HelpFormatter(prog=sub.prog, width=100)
    formatter.add_usage(sub.usage, sub._actions, sub._mutually_exclusive_groups)
    return formatter.format_help().strip()


def render_cli() -> str:
    """Every subcommand: its one-line help, usage, description and arguments."""
    parser = build_parser()
    out = [f"`digest`: {parser.description}", ""]
    options = [
        a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)
    ]
    if options:
        out += ["Before the command:", "", "| argument | what | |", "| --- | --- | --- |"]
        out += [_argument(a) for a in options]
        out.append("")
    for name, summary, sub in _subcommands(parser):
        out += [f"## `digest {name}`", "", f"*{summary}*", "", "```text", _usage(sub)]
        out += ["```", "", sub.description or "", ""]
        actions = [a for a in sub._actions if not isinstance(a, argparse._HelpAction)]
        if actions:
            out += ["| argument | what | |", "| --- | --- | --- |"]
            out += [_argument(a) for a in actions]
            out.append("")
    return "\n".join(out)


def render_component() -> str:
    """Every attribute of `WeeklyDigest`, nested sections included, with its meaning and default."""
    from digest_pipeline.component.weekly_digest import WeeklyDigest

    out = ["| attribute | what | default |", "| --- | --- | --- |"]
    for name, field in WeeklyDigest.model_fields.items():
        nested = field.annotation
        inner = [a for a in getattr(nested, "__args__", ()) if hasattr(a, "model_fields")]
        if inner:
            out.append(f"| `{name}:` | {_cell(inner[0].__doc__ or '')} | — |")
            for sub, subfield in inner[0].model_fields.items():
                out.append(f"| `{name}.{sub}` | {_cell(subfield.description or '')} | — |")
            continue
        default = "—" if field.default in (None, ...) or field.default_factory else field.default
        default = f"`{default}`" if default != "—" else default
        out.append(f"| `{name}` | {_cell(field.description or '')} | {default} |")
    return "\n".join(out)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """Fill the markers of the page being built."""
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, render_cli())
    if SETTINGS_MARKER in markdown:
        markdown = markdown.replace(SETTINGS_MARKER, render_markdown())
    if COMPONENT_MARKER in markdown:
        markdown = markdown.replace(COMPONENT_MARKER, render_component())
    return markdown
