"""A loopback stand-in for the Hugging Face Hub, for tests: standard library (plus PyYAML) only.

No PyPI package offers a Hub server that accepts uploads, so this one speaks the subset of the
Hub HTTP API that huggingface_hub 2.4 and transformers 5.23 use to publish and download models:

- `GET /api/whoami-v2`, `POST /api/repos/create`, `POST /api/validate-yaml`
- `GET /api/models/{id}[/revision/{rev}]`, `GET .../refs`, `GET .../tree/{rev}[/{path}]`,
  `POST .../paths-info/{rev}`, `POST .../preupload/{rev}` (always `uploadMode: regular`, so hf-xet
  never switches to Xet storage), `POST .../commit/{rev}` (NDJSON), `POST|DELETE .../branch/{name}`,
  `POST .../tag/{rev}`
- `HEAD|GET /{id}/resolve/{rev}/{path}` with `X-Repo-Commit`, `ETag` (the git blob id) and
  `Content-Length`; errors carry `X-Error-Code` (RepoNotFound, RevisionNotFound, EntryNotFound) so
  the clients raise their real exception types.

It binds 127.0.0.1 only, keeps repositories in memory, and logs every request (and every request
it does not understand, with 404) to `--log`, so a client change shows up as a readable failure.
Run: `python tests/hub_server.py --port-file PORTFILE [--log LOG] [--token TOKEN]`.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

DEFAULT_TOKEN = "hf_pacer_fake_test_token"
USER = "pacer-tester"
REPO_TYPES = {"models": "model", "datasets": "dataset", "spaces": "space"}
_COMMIT = re.compile(r"[0-9a-f]{40}")
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")
_API = re.compile(r"^/api/(models|datasets|spaces)/([^/]+/[^/]+)(?:/(.*))?$")
_RESOLVE = re.compile(r"^/(?:(datasets|spaces)/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")
_KNOWN_FIELDS = {  # card metadata fields the real Hub type-checks, with what it accepts
    "license": (str,),
    "library_name": (str,),
    "pipeline_tag": (str,),
    "tags": (list,),
    "datasets": (str, list),
    "language": (str, list),
    "base_model": (str, list),
    "metrics": (str, list),
    "model-index": (list,),
}


def git_blob_id(content: bytes) -> str:
    """The id git (and the Hub's ETag for non-LFS files) gives a file's content."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


@dataclass
class Repo:
    repo_id: str
    repo_type: str
    private: bool
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    created: float = field(default_factory=time.time)

    def resolve(self, revision: str) -> str | None:
        """Branch, tag, full commit id or `refs/heads|tags/<name>` -> commit id (None if unknown)."""
        revision = unquote(revision)
        for prefix, table in (("refs/heads/", self.branches), ("refs/tags/", self.tags)):
            if revision.startswith(prefix):
                return table.get(revision[len(prefix):])
        if revision in self.branches:
            return self.branches[revision]
        if revision in self.tags:
            return self.tags[revision]
        if _COMMIT.fullmatch(revision) and revision in self.commits:
            return revision
        return None

    def commit(self, branch: str, files: dict[str, bytes], message: str) -> str:
        digest = hashlib.sha1(json.dumps([self.repo_id, branch, message, time.time_ns(),
                                          sorted((p, git_blob_id(c)) for p, c in files.items())]).encode())
        sha = digest.hexdigest()
        self.commits[sha] = files
        self.branches[branch] = sha
        return sha


class HubState:
    """All repositories of the server, guarded by one lock (requests arrive on several threads)."""

    def __init__(self, token: str):
        self.token = token
        self.repos: dict[tuple[str, str], Repo] = {}
        self.lock = threading.Lock()


class HubError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, commit: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.commit = status, message, code, commit


class Handler(BaseHTTPRequestHandler):
    server_version = "PacerTestHub/1.0"
    protocol_version = "HTTP/1.1"
    state: HubState
    log_file = None

    # ---------------------------------------------------------------- plumbing
    def log_message(self, format: str, *args) -> None:  # noqa: A002 - BaseHTTPRequestHandler's signature
        if self.log_file is not None:
            self.log_file.write(f"{time.strftime('%H:%M:%S')} {format % args}\n")
            self.log_file.flush()

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None,
              content_type: str = "application/json", head: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _json(self, status: int, payload, headers: dict | None = None) -> None:
        self._send(status, json.dumps(payload).encode(), headers)

    def _error(self, error: HubError, head: bool = False) -> None:
        headers = {"X-Error-Message": error.message}
        if error.code:
            headers["X-Error-Code"] = error.code
        if error.commit:
            headers["X-Repo-Commit"] = error.commit
        self._send(error.status, json.dumps({"error": error.message}).encode(), headers, head=head)

    def _authorized(self) -> bool:
        return self.headers.get("Authorization", "") == f"Bearer {self.state.token}"

    def _require_write(self) -> None:
        if not self._authorized():
            raise HubError(401, "Invalid credentials in Authorization header")

    def _endpoint(self) -> str:
        return f"http://{self.headers.get('Host', '127.0.0.1')}"

    def _repo(self, repo_type: str, repo_id: str) -> Repo:
        repo = self.state.repos.get((repo_type, repo_id))
        if repo is None or (repo.private and not self._authorized()):
            raise HubError(404, "Repository not found", "RepoNotFound")
        return repo

    def _commit_of(self, repo: Repo, revision: str) -> str:
        sha = repo.resolve(revision)
        if sha is None:
            raise HubError(404, f"Invalid rev id: {unquote(revision)}", "RevisionNotFound")
        return sha

    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        head = method == "HEAD"
        try:
            with self.state.lock:
                self._route(method, url.path, query)
        except HubError as error:
            self._error(error, head=head)
        except Exception as error:  # a bug here must show up in the client, not hang it
            self._error(HubError(500, f"test hub server error: {type(error).__name__}: {error}"), head=head)
            raise

    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        self._dispatch("GET")

    def do_HEAD(self) -> None:  # noqa: N802
        self._dispatch("HEAD")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")

    def do_DELETE(self) -> None:  # noqa: N802
        self._dispatch("DELETE")

    def do_PUT(self) -> None:  # noqa: N802
        self._dispatch("PUT")

    # ---------------------------------------------------------------- routes
    def _route(self, method: str, path: str, query: dict) -> None:
        if path == "/api/whoami-v2" and method == "GET":
            return self._whoami()
        if path == "/api/repos/create" and method == "POST":
            return self._create_repo()
        if path == "/api/validate-yaml" and method == "POST":
            return self._validate_yaml()
        if match := _API.match(path):
            kind, repo_id, rest = match.groups()
            return self._repo_api(method, REPO_TYPES[kind], unquote(repo_id), rest or "", query)
        if (match := _RESOLVE.match(path)) and method in ("GET", "HEAD"):
            kind, repo_id, revision, file_path = match.groups()
            return self._resolve(method, REPO_TYPES[kind or "models"], unquote(repo_id), revision, unquote(file_path))
        self._body()
        self.log_message("UNHANDLED %s %s", method, self.path)
        raise HubError(404, f"test hub server does not implement {method} {path}")

    def _whoami(self) -> None:
        if not self._authorized():
            raise HubError(401, "Invalid credentials in Authorization header")
        self._json(200, {
            "type": "user", "id": "0" * 24, "name": USER, "fullname": "Pacer Tester", "email": None,
            "emailVerified": True, "isPro": False, "orgs": [],
            "auth": {"type": "access_token", "accessToken": {"displayName": "pacer-test", "role": "write"}},
        })

    def _create_repo(self) -> None:
        self._require_write()
        payload = json.loads(self._body() or b"{}")
        name, organization = payload.get("name"), payload.get("organization")
        repo_type = payload.get("type") or "model"
        repo_id = f"{organization or USER}/{name}"
        if not name or not _REPO_ID.match(repo_id) or repo_type not in REPO_TYPES.values():
            raise HubError(400, f"Invalid repo name {repo_id!r} or type {repo_type!r}")
        prefix = "" if repo_type == "model" else f"{repo_type}s/"
        url = f"{self._endpoint()}/{prefix}{repo_id}"
        if (repo_type, repo_id) in self.state.repos:
            return self._json(409, {"error": "You already created this model repo", "url": url})
        repo = Repo(repo_id, repo_type, private=payload.get("visibility") == "private" or bool(payload.get("private")))
        repo.commit("main", {".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"}, "initial commit")
        self.state.repos[(repo_type, repo_id)] = repo
        self._json(200, {"url": url, "name": repo_id, "id": hashlib.sha1(repo_id.encode()).hexdigest()[:24]})

    def _validate_yaml(self) -> None:
        payload = json.loads(self._body() or b"{}")
        errors, warnings = validate_card_metadata(payload.get("content", ""))
        status = 400 if errors else 200
        self._json(status, {"errors": [{"message": m} for m in errors], "warnings": [{"message": m} for m in warnings]})

    def _repo_api(self, method: str, repo_type: str, repo_id: str, rest: str, query: dict) -> None:
        body = self._body() if method in ("POST", "PUT", "DELETE") else b""
        repo = self._repo(repo_type, repo_id)
        action, _, arg = rest.partition("/")
        if action == "" and method == "GET":
            return self._info(repo, repo.branches["main"])
        if action == "revision" and method == "GET":
            return self._info(repo, self._commit_of(repo, arg))
        if action == "refs" and method == "GET":
            return self._refs(repo)
        if action == "tree" and method == "GET":
            revision, _, sub = arg.partition("/")
            return self._tree(repo, self._commit_of(repo, revision), unquote(sub), query)
        if action == "paths-info" and method == "POST":
            return self._paths_info(repo, self._commit_of(repo, arg), body)
        if action == "preupload" and method == "POST":
            return self._preupload(repo, arg, body)
        if action == "commit" and method == "POST":
            self._require_write()
            return self._commit(repo, unquote(arg), body, query)
        if action == "branch" and method in ("POST", "DELETE"):
            self._require_write()
            return self._branch(repo, unquote(arg), method, body)
        if action == "tag" and method == "POST":
            self._require_write()
            return self._tag(repo, arg, body)
        self.log_message("UNHANDLED %s %s", method, self.path)
        raise HubError(404, f"test hub server does not implement {method} /api/.../{rest}")

    def _info(self, repo: Repo, sha: str) -> None:
        files = repo.commits[sha]
        card = _front_matter(files.get("README.md", b"").decode(errors="replace"))
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(repo.created))
        self._json(200, {
            "_id": hashlib.sha1(repo.repo_id.encode()).hexdigest()[:24], "id": repo.repo_id, "modelId": repo.repo_id,
            "author": repo.repo_id.split("/")[0], "sha": sha, "private": repo.private, "gated": False,
            "disabled": False, "downloads": 0, "likes": 0, "tags": list(card.get("tags") or []) if card else [],
            "library_name": card.get("library_name") if card else None, "cardData": card or None,
            "siblings": [{"rfilename": p} for p in sorted(files)], "lastModified": stamp, "createdAt": stamp,
        })

    def _refs(self, repo: Repo) -> None:
        def refs(table: dict, kind: str) -> list:
            return [{"name": n, "ref": f"refs/{kind}/{n}", "targetCommit": c} for n, c in sorted(table.items())]

        self._json(200, {"branches": refs(repo.branches, "heads"), "tags": refs(repo.tags, "tags"),
                         "converts": [], "pullRequests": []})

    @staticmethod
    def _entry(path: str, content: bytes) -> dict:
        return {"type": "file", "oid": git_blob_id(content), "size": len(content), "path": path}

    def _tree(self, repo: Repo, sha: str, sub: str, query: dict) -> None:
        files = repo.commits[sha]
        recursive = (query.get("recursive") or ["false"])[0].lower() in ("1", "true")
        prefix = sub.strip("/") + "/" if sub.strip("/") else ""
        if prefix and not any(p.startswith(prefix) for p in files):
            raise HubError(404, f"{sub} does not exist on {sha}", "EntryNotFound", commit=sha)
        entries, folders = [], set()
        for path in sorted(files):
            if not path.startswith(prefix):
                continue
            rest = path[len(prefix):]
            if "/" in rest and not recursive:
                folders.add(prefix + rest.split("/")[0])
                continue
            if recursive:
                parts = rest.split("/")[:-1]
                folders.update(prefix + "/".join(parts[: i + 1]) for i in range(len(parts)))
            entries.append(self._entry(path, files[path]))
        entries += [{"type": "directory", "oid": "0" * 40, "size": 0, "path": f} for f in sorted(folders)]
        self._json(200, entries, {"X-Repo-Commit": sha})

    def _paths_info(self, repo: Repo, sha: str, body: bytes) -> None:
        try:
            payload = json.loads(body)
            paths = payload.get("paths") or []
        except ValueError:
            paths = parse_qs(body.decode()).get("paths", [])
        paths = [paths] if isinstance(paths, str) else paths
        files = repo.commits[sha]
        out = []
        for path in paths:
            path = path.strip("/")
            if path in files:
                out.append(self._entry(path, files[path]))
            elif any(p.startswith(path + "/") for p in files):
                out.append({"type": "directory", "oid": "0" * 40, "size": 0, "path": path})
        self._json(200, out, {"X-Repo-Commit": sha})

    def _preupload(self, repo: Repo, revision: str, body: bytes) -> None:
        files = repo.commits.get(repo.resolve(revision) or "", {})
        payload = json.loads(body or b"{}")
        out = []
        for item in payload.get("files", []):
            existing = files.get(item["path"])
            out.append({"path": item["path"], "uploadMode": "regular", "shouldIgnore": False,
                        "oid": git_blob_id(existing) if existing is not None else None})
        self._json(200, {"files": out, "commitOid": repo.resolve(revision)})

    def _commit(self, repo: Repo, branch: str, body: bytes, query: dict) -> None:
        if query.get("create_pr"):
            raise HubError(400, "the test hub server does not support pull requests (create_pr)")
        if branch not in repo.branches:
            raise HubError(404, f"Invalid rev id: {branch} (commits go to an existing branch)", "RevisionNotFound")
        files = dict(repo.commits[repo.branches[branch]])
        summary = ""
        for line in body.splitlines():
            if not line.strip():
                continue
            item = json.loads(line)
            key, value = item["key"], item["value"]
            if key == "header":
                summary = value.get("summary", "")
                parent = value.get("parentCommit")
                if parent and parent != repo.branches[branch]:
                    raise HubError(412, f"parent commit {parent} is not the head of {branch}")
            elif key == "file":
                if value.get("encoding", "base64") != "base64":
                    raise HubError(400, f"unsupported encoding {value.get('encoding')!r}")
                files[value["path"]] = base64.b64decode(value["content"])
            elif key == "deletedFile":
                if value["path"] not in files:
                    raise HubError(404, "A file with this name doesn't exist", "EntryNotFound")
                del files[value["path"]]
            elif key == "deletedFolder":
                prefix = value["path"].rstrip("/") + "/"
                files = {p: c for p, c in files.items() if not p.startswith(prefix)}
            else:  # lfsFile, xet: preupload always answered "regular", so a client sending these is a bug
                raise HubError(400, f"the test hub server accepts regular uploads only, got {key!r}")
        sha = repo.commit(branch, files, summary)
        prefix = "" if repo.repo_type == "model" else f"{repo.repo_type}s/"
        self._json(200, {"commitUrl": f"{self._endpoint()}/{prefix}{repo.repo_id}/commit/{sha}",
                         "commitOid": sha, "pullRequestUrl": None, "success": True})

    def _branch(self, repo: Repo, branch: str, method: str, body: bytes) -> None:
        if method == "DELETE":
            if branch not in repo.branches or branch == "main":
                raise HubError(404 if branch not in repo.branches else 403, f"cannot delete branch {branch}",
                               "RevisionNotFound" if branch not in repo.branches else None)
            del repo.branches[branch]
            return self._json(200, {})
        if branch in repo.branches:
            raise HubError(409, f"Reference refs/heads/{branch} already exists")
        payload = json.loads(body or b"{}")
        start = payload.get("startingPoint") or "main"
        repo.branches[branch] = self._commit_of(repo, start)
        self._json(200, {})

    def _tag(self, repo: Repo, revision: str, body: bytes) -> None:
        payload = json.loads(body or b"{}")
        tag = payload.get("tag")
        if not tag:
            raise HubError(400, "missing tag name")
        if tag in repo.tags:
            raise HubError(409, f"Tag {tag} already exists")
        repo.tags[tag] = self._commit_of(repo, revision)
        self._json(200, {})

    def _resolve(self, method: str, repo_type: str, repo_id: str, revision: str, path: str) -> None:
        head = method == "HEAD"
        repo = self._repo(repo_type, repo_id)
        sha = self._commit_of(repo, revision)
        content = repo.commits[sha].get(path)
        if content is None:
            raise HubError(404, "Entry not found", "EntryNotFound", commit=sha)
        headers = {"X-Repo-Commit": sha, "ETag": f'"{git_blob_id(content)}"', "Accept-Ranges": "bytes"}
        status, body = 200, content
        if (ranged := re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))) and not head:
            start = int(ranged.group(1))
            end = int(ranged.group(2)) if ranged.group(2) else len(content) - 1
            status, body = 206, content[start: end + 1]
            headers["Content-Range"] = f"bytes {start}-{start + len(body) - 1}/{len(content)}"
        self._send(status, body, headers, content_type="application/octet-stream", head=head)


def _front_matter(text: str) -> dict | None:
    match = re.match(r"^---\s*\n(.*?)\n---\s*(\n|$)", text, flags=re.S)
    if not match:
        return None
    data = yaml.safe_load(match.group(1))
    return data if isinstance(data, dict) else None


def validate_card_metadata(content: str) -> tuple[list[str], list[str]]:
    """(errors, warnings) for a README's YAML block, checked like the Hub checks the common fields."""
    match = re.match(r"^---\s*\n(.*?)\n---\s*(\n|$)", content, flags=re.S)
    if not match:
        return [], ["Empty or missing yaml metadata in repo card"]
    try:
        data = yaml.safe_load(match.group(1))
    except yaml.YAMLError as error:
        return [f"YAML parse error: {error}"], []
    if data is None:
        return [], ["Empty or missing yaml metadata in repo card"]
    if not isinstance(data, dict):
        return ["\"metadata\" must be a YAML mapping"], []
    errors = []
    for key, types in _KNOWN_FIELDS.items():
        if key in data and not isinstance(data[key], types):
            errors.append(f'"{key}" must be of type {" or ".join(t.__name__ for t in types)}')
        elif isinstance(data.get(key), list) and key != "model-index":
            errors += [f'"{key}[{i}]" must be a string' for i, v in enumerate(data[key]) if not isinstance(v, str)]
    for model in ([data["base_model"]] if isinstance(data.get("base_model"), str) else data.get("base_model") or []):
        if isinstance(model, str) and not _REPO_ID.match(model):
            errors.append(f'"base_model" must be a Hub model id, got {model!r}')
    return errors, []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--port-file", type=Path, help="write the port here once listening")
    parser.add_argument("--log", type=Path, help="append one line per request here")
    parser.add_argument("--token", default=DEFAULT_TOKEN, help="the only token accepted for writes")
    args = parser.parse_args(argv)
    Handler.state = HubState(args.token)
    Handler.log_file = args.log.open("a") if args.log else None
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    port = server.server_address[1]
    if args.port_file:
        tmp = args.port_file.with_suffix(".tmp")
        tmp.write_text(str(port))
        tmp.replace(args.port_file)
    print(f"test hub listening on http://127.0.0.1:{port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
