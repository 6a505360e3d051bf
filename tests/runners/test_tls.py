"""Mutual TLS between the API and a runner (docs/deployment.md): the runner proves itself
with its certificate and accepts only API processes whose certificate its CA signed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from toolkiln.config import RunnerSettings
from toolkiln.domain.execution import RunRequest
from toolkiln.runners import wire
from toolkiln.runners.client import RunnerClient, start_of
from toolkiln.runners.local import channel_credentials
from toolkiln.runners.process import host_for, server_credentials
from toolkiln.runners.server import RunnerService, make_server

TOKEN = "tls-runner-token"
CODE = "def main(**p):\n    return {'message': 'over tls'}\n"


class Link:
    def admit(self) -> bool:
        return True

    def call(self, name: str, payload: object) -> object:
        return {}

    def audit(self, event: str, data: object) -> str | None:
        return None


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, trustme.CA]]:
    tmp = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    issued = ca.issue_cert("localhost")
    issued.private_key_pem.write_to_path(str(tmp / "runner.key"))
    issued.cert_chain_pems[0].write_to_path(str(tmp / "runner.pem"))
    ca.cert_pem.write_to_path(str(tmp / "ca.pem"))
    settings = RunnerSettings(
        data_dir=tmp / "data",
        sandbox_warm=1,
        runner_tls_cert=tmp / "runner.pem",
        runner_tls_key=tmp / "runner.key",
        runner_tls_client_ca=tmp / "ca.pem",
    )
    host = host_for(settings)
    service = RunnerService(host)
    server, port = make_server(service, "localhost:0", TOKEN, server_credentials(settings))
    yield f"localhost:{port}", tmp, ca
    server.stop(None)
    service.close()
    host.close()


def _client_cert(tmp: Path, ca: trustme.CA, name: str) -> tuple[Path, Path]:
    issued = ca.issue_cert(f"{name}.api.test")
    issued.private_key_pem.write_to_path(str(tmp / f"{name}.key"))
    issued.cert_chain_pems[0].write_to_path(str(tmp / f"{name}.pem"))
    return tmp / f"{name}.pem", tmp / f"{name}.key"


def test_an_api_with_a_certificate_of_the_runners_ca_runs_code(
    tls: tuple[str, Path, trustme.CA],
) -> None:
    address, tmp, ca = tls
    cert, key = _client_cert(tmp, ca, "api")
    client = RunnerClient(address, TOKEN, channel_credentials(tmp / "ca.pem", cert, key))
    try:
        client.check()
        assert client.state == "serving"
        req = RunRequest("python", CODE, "main", {}, 5000, workspace_id="w")
        out = client.run(start_of(req, "share", True), Link())
        assert (out.kind, out.value) == ("return", {"message": "over tls"}), out
        answer = client.analyse(wire.Analyse("python", CODE, "w"), 30)
        assert answer.entrypoint == "main" and answer.problems == [], answer
    finally:
        client.close()


def test_an_api_without_a_certificate_or_with_another_cas_is_refused(
    tls: tuple[str, Path, trustme.CA],
) -> None:
    address, tmp, _ = tls
    stranger_ca = trustme.CA()
    cert, key = _client_cert(tmp, stranger_ca, "stranger")
    for creds in (
        channel_credentials(tmp / "ca.pem", None, None),  # the right token, no certificate
        channel_credentials(tmp / "ca.pem", cert, key),  # a certificate of another CA
    ):
        client = RunnerClient(address, TOKEN, creds)
        try:
            client.check()
            assert client.state == "unreachable", client.state
        finally:
            client.close()


def test_a_runner_with_a_certificate_the_api_does_not_trust_is_not_used(
    tls: tuple[str, Path, trustme.CA],
) -> None:
    address, tmp, ca = tls
    other = trustme.CA()
    other.cert_pem.write_to_path(str(tmp / "other-ca.pem"))
    cert, key = _client_cert(tmp, ca, "api2")
    client = RunnerClient(address, TOKEN, channel_credentials(tmp / "other-ca.pem", cert, key))
    try:
        client.check()
        assert client.state == "unreachable", client.state
    finally:
        client.close()
