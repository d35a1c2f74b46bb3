"""`eaglectl upload DEST ORG/NAME`: the step after a PASS — run the gate, then publish exactly the files it checked.

The gate is `check` with the same options (check.py). A FAIL, an undecided gate (a stage eaglectl could
not run, here or with its reference drafter: exit 10), or a local path anywhere in the files (rules/publish.py) refuses the upload
before anything touches the network. The files are those `check`'s publish stage listed
(publish.upload_files); they go up as one commit of huggingface_hub's own `CommitOperationAdd`
operations through `HfApi.create_commit`, the repo created when missing (`--private` then applies) and
the branch too (`--revision`), or as a pull request (`--create-pr`). The token is huggingface_hub's:
`HF_TOKEN`, else the one `hf auth login` stored. `--dry-run` plans the same operations (sizes and
sha256 computed by huggingface_hub) and sends nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..checkpoint.publish import upload_files
from ..errors import CheckpointNotFoundError, MissingDependencyError, UsageError, first_line
from ..io.hub import hub_failure
from ..progress import Progress, passthrough
from ..result import Result
from .check import CheckReport
from .check import run as run_gate
from .requests import UploadRequest

if TYPE_CHECKING:
    from huggingface_hub import CommitInfo, CommitOperationAdd

    from ..rules import Finding


@dataclass
class UploadReport(Result):
    SCHEMA, COMMAND = "eaglectl.upload/1", "upload"

    source: str
    repo_id: str
    gate: CheckReport
    operations: list[CommitOperationAdd]  # in upload order
    commit_message: str
    commit_description: str
    dry_run: bool
    revision: str | None = None
    create_pr: bool = False
    private: bool = False
    refused: str | None = None  # why nothing was uploaded (the gate failed, a local path)
    refused_code: int = 0
    commit_url: str | None = None
    pr_url: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def findings(self) -> list[Finding]:
        return self.gate.findings  # -q names the failing rules

    @property
    def exit_code(self) -> int:
        return self.refused_code if self.refused else 0

    def summary_line(self) -> str:
        if self.refused:
            return f"refused: {self.refused}"
        n = len(self.operations)
        if self.dry_run:
            return f"dry run: {n} file(s) would go to {self.repo_id}"
        return f"{n} file(s) to {self.repo_id}: {self.pr_url or self.commit_url}"

    def operation_rows(self) -> list[dict[str, Any]]:
        return [{"operation": "add", "path_in_repo": op.path_in_repo, "size": op.upload_info.size,
                 "sha256": op.upload_info.sha256.hex()} for op in self.operations]

    def payload(self) -> dict[str, Any]:
        return {"source": self.source,
                "repo_id": self.repo_id, "revision": self.revision, "create_pr": self.create_pr,
                "private": self.private, "dry_run": self.dry_run, "gate": self.gate.to_json(),
                "operations": self.operation_rows(), "commit_message": self.commit_message,
                "commit_description": self.commit_description, "refused": self.refused,
                "uploaded": self.commit_url is not None, "commit_url": self.commit_url, "pr_url": self.pr_url,
                "notes": self.notes}


def commit_text(gate: CheckReport) -> tuple[str, str]:
    """(commit message, description) made from the gate's report: what was uploaded and what was checked."""
    inspect_stage = next((s for s in gate.stages if s.name == "inspect"), None)
    data = (inspect_stage.data or {}) if inspect_stage else {}
    what = f"EAGLE-{data.get('eagle_version', '?')} drafter ({data.get('dialect', '?')})"
    verdict = gate.verdict
    # an upgrade's output passes the gate as a warm start: the title says so, not PASS alone
    if any(f.rule_id == "needs-fine-tuning" for f in gate.findings):
        what += ", a warm start (structurally upgraded, not fine-tuned)"
    message = f"Upload {what}: eaglectl check {verdict}"
    lines = [f"Uploaded with eaglectl {__version__} after its pre-publish gate (`eaglectl check`): {verdict}.", "",
             "| stage | status | what was checked |", "|---|---|---|"]
    lines += [f"| {s.name} | {s.status} | {s.detail.replace('|', '/')} |" for s in gate.stages]
    shown = [f for f in gate.findings if f.severity != "info"]
    if shown:
        lines += ["", "Findings:", ""] + [f"- {f.severity} `{f.rule_id}`: {f.message}" for f in shown]
    return message, "\n".join(lines) + "\n"


def require_folder(folder: str) -> Path:
    """DEST must be a local folder (checked before the gate runs)."""
    path = Path(folder)
    if not path.is_dir():
        raise UsageError(f"{folder}: upload sends a local folder (what convert / upgrade wrote); this is "
                         + ("a file" if path.exists() else "no folder here"), hint="eaglectl upload DEST ORG/NAME")
    return path


def run(req: UploadRequest, progress: Progress = passthrough) -> UploadReport:
    """Run the gate (check.run on the same folder), then upload the folder to the Hub repo `repo_id` when it
    passed."""
    from huggingface_hub import CommitOperationAdd

    folder, repo_id, revision, create_pr, private, dry_run = (req.folder, req.repo_id, req.revision, req.create_pr,
                                                              req.private, req.dry_run)
    root = require_folder(folder)  # before the gate runs: upload sends a folder
    if not dry_run:
        _credentials()  # offline, or no token: said before the gate's stages run, not after them
    gate = run_gate(req.gate, progress)  # the gate's source is the folder
    try:  # every file publish.upload_files lists (the file a link inside the folder resolves to: never one outside)
        operations = [CommitOperationAdd(path_in_repo=rel, path_or_fileobj=str(path))
                      for rel, path in upload_files(root)]
        unsendable = None
    except UsageError as e:  # a link out of the folder, a FIFO: the gate's publish stage failed on it too
        operations, unsendable = [], e
    message, description = commit_text(gate)
    rep = UploadReport(folder, repo_id, gate, operations, req.commit_message or message, description, dry_run, revision,
                       create_pr, private)
    local = [f for f in gate.findings if f.rule_id == "local-path"]
    if unsendable is not None:
        rep.refused, rep.refused_code = unsendable.message, gate.exit_code or unsendable.exit_code
    elif gate.exit_code != 0:
        undecided = [s.name for s in gate.stages if s.status == "undecided"]
        rep.refused = (f"the gate is undecided: eaglectl could not run {', '.join(undecided)} (exit 10; not a "
                       "failure of the drafter, and not a pass)" if gate.exit_code == MissingDependencyError.exit_code
                       else "the gate failed")
        rep.refused_code = gate.exit_code
    elif local:
        rep.refused, rep.refused_code = f"{len(local)} local path(s) in the files ({local[0].locator})", 1
    if not operations and not rep.refused:
        rep.refused, rep.refused_code = "no files to upload", 1
    if rep.refused or dry_run:
        return rep
    commit = _commit(rep)
    rep.commit_url = getattr(commit, "commit_url", None) or str(commit)
    rep.pr_url = getattr(commit, "pr_url", None)
    return rep


def _credentials() -> str:
    """The Hub token, or MissingDependencyError when this machine cannot upload (offline, no token)."""
    from huggingface_hub import constants, get_token

    if constants.HF_HUB_OFFLINE:
        raise MissingDependencyError("HF_HUB_OFFLINE is set: nothing can be uploaded",
                                     hint="unset HF_HUB_OFFLINE on the upload step (or run with --dry-run)")
    token = get_token()
    if not token:
        raise MissingDependencyError("no Hugging Face token: set HF_TOKEN (a write token) or run `hf auth login`",
                                     hint="in CI, give the upload step only: env: HF_TOKEN: ${{ secrets.HF_TOKEN }}")
    return token


def _commit(rep: UploadReport) -> CommitInfo:
    """The network part: repo (and branch) when missing, then one commit. Every failure is one line."""
    from huggingface_hub import HfApi

    api = HfApi(token=_credentials())
    where = rep.repo_id + (f"@{rep.revision}" if rep.revision else "")
    try:
        api.create_repo(rep.repo_id, repo_type="model", private=rep.private or None, exist_ok=True)
        if rep.revision and not rep.create_pr:
            api.create_branch(rep.repo_id, branch=rep.revision, repo_type="model", exist_ok=True)
        return api.create_commit(rep.repo_id, rep.operations, commit_message=rep.commit_message,
                                 commit_description=rep.commit_description, repo_type="model",
                                 revision=rep.revision, create_pr=rep.create_pr or None)
    except Exception as e:
        failure, why = hub_failure(e), first_line(e)
        if failure == "repository":
            raise CheckpointNotFoundError(f"{rep.repo_id}: repository not found or not writable ({why})",
                                          repo=rep.repo_id,
                                          hint="check the id and that HF_TOKEN can write to it") from None
        if failure == "revision":
            raise CheckpointNotFoundError(f"{where}: revision not found", repo=rep.repo_id) from None
        refusals = {"forbidden": f"{rep.repo_id}: the token may not write here ({why})",
                    "refused": f"{where}: the Hub refused the upload ({why})",
                    "unreachable": f"{where}: cannot reach the Hub ({why})"}
        if failure in refusals:
            raise MissingDependencyError(refusals[failure], hint="use a write token for this org (HF_TOKEN)"
                                         if failure == "forbidden" else None) from None
        raise
