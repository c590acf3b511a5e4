"""MkDocs hooks (mkdocs.yml `hooks:`): the generated CLI reference and methods table, and repository
files cited by the docs.

- `cli.md` is written from the click commands themselves, so the reference cannot drift from `--help`.
- A page's `<!-- methods -->` line becomes the table of the registered drafting methods
  (`eaglespec.decoding.drafters`), so a new drafter file appears in the docs without an edit here.
- A page cites a repository file (a result's JSON, a plot, a script) with a link relative to `docs/`,
  `../benchmarks/results/x.json`, which also works when the Markdown is read in the repository. The
  build copies each cited file into the site under `repo/` and points the link there; a cited file
  that does not exist fails the build, as a broken link between pages does under `--strict`. The
  README's links to repository files are checked the same way.
"""

from __future__ import annotations

import re
from pathlib import Path

import click
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

from eaglespec.cli import main as cli
from eaglespec.decoding.drafters import DRAFTERS

ROOT = Path(__file__).resolve().parent.parent
# a Markdown link or image target: ](target) or ](target#anchor), outside code spans
LINK = re.compile(r"\]\(([^)\s#]+)(#[^)\s]*)?\)")


def _targets(text: str) -> list[str]:
    """Link targets of Markdown text, leaving out fenced code blocks and inline code."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return [m.group(1) for m in LINK.finditer(text)]


def _repo_file(target: str, base: Path) -> Path | None:
    """The repository file a relative link from `base` (a folder) names, when it leaves docs/."""
    if "://" in target or target.startswith(("mailto:", "/")):
        return None
    path = (base / target).resolve()
    docs = ROOT / "docs"
    return None if path == docs or docs in path.parents else path


def _check_readme() -> None:
    """Every relative link of the README names a file or folder of the repository (docs pages included)."""
    missing = [t for t in _targets((ROOT / "README.md").read_text())
               if "://" not in t and not t.startswith(("mailto:", "#")) and not (ROOT / t).exists()]
    if missing:
        raise PluginError(f"README.md links to files that do not exist: {', '.join(missing)}")


def on_files(files: Files, config) -> Files:
    _check_readme()
    docs = Path(config["docs_dir"])
    cited: set[Path] = set()
    for page in docs.glob("*.md"):
        for target in _targets(page.read_text()):
            path = _repo_file(target, docs)
            if path is None:
                continue
            if not path.is_file() or ROOT not in path.parents:
                raise PluginError(f"docs/{page.name} cites '{target}', which is not a file of the repository")
            cited.add(path)
    for path in sorted(cited):
        files.append(File.generated(config, f"repo/{path.relative_to(ROOT).as_posix()}", abs_src_path=str(path)))
    files.append(File.generated(config, "cli.md", content=cli_reference()))
    return files


def methods_table() -> str:
    """The registered drafting methods: spec, what drafts, its file, what it needs loaded."""
    rows = ["| `--method` | what drafts | file | needs beside the target |", "|---|---|---|---|",
            "| `vanilla` | nothing: one token per target forward | | nothing |"]
    for cls in DRAFTERS.values():
        module = cls.__module__.removeprefix("eaglespec.").replace(".", "/") + ".py"
        needs = cls.needs.noun if cls.needs else "nothing"
        rows.append(f"| `{cls.syntax}` | {cls.summary} | `{module}` | {needs} |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, page, config, files) -> str:
    """The methods table where a page asks for it; links to repository files pointed at their
    copies in the site."""
    markdown = markdown.replace("<!-- methods -->", methods_table())
    def swap(match: re.Match) -> str:
        target, anchor = match.group(1), match.group(2) or ""
        path = _repo_file(target, Path(config["docs_dir"]))
        if path is None:
            return match.group(0)
        return f"](repo/{path.relative_to(ROOT).as_posix()}{anchor})"

    return LINK.sub(swap, markdown)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def cli_reference() -> str:
    """Markdown for every `eaglespec` command: its help, usage and options, as click renders them."""
    lines = ["# CLI reference", "",
             "Generated from the commands themselves when the docs are built; `eaglespec COMMAND --help` "
             "prints the same.", ""]
    root = click.Context(cli, info_name="eaglespec")
    for name in sorted(cli.list_commands(root)):
        command = cli.get_command(root, name)
        ctx = click.Context(command, info_name=name, parent=root)
        lines += [f"## eaglespec {name}", "", (command.help or "").strip(), "", "```",
                  f"eaglespec {name} {' '.join(command.collect_usage_pieces(ctx))}", "```", ""]
        records = [r for p in command.get_params(ctx) if p.name != "help" and (r := p.get_help_record(ctx))]
        if records:
            lines += ["| option | meaning |", "|---|---|"]
            lines += [f"| `{_cell(opts)}` | {_cell(help_text)} |" for opts, help_text in records]
            lines.append("")
    return "\n".join(lines)
