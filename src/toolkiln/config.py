"""Typed settings from ``TOOLKILN_*`` environment variables; every one has a working default.

Settings are built by the composition root (``toolkiln.app``) and passed down, never read
at import time.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from toolkiln.domain.errors import ServiceUnavailable
from toolkiln.domain.limits import LLM_ANSWER_BYTES
from toolkiln.services import places
from toolkiln.storage.sealing import parse_key

SEARCH_PROVIDERS = ("searxng", "brave")
DATABASE_BACKENDS = ("sqlite", "postgresql")


class SettingError(ValueError):
    """A wrong value (or combination), found before anything starts: ``setting`` is the
    variable to name, ``TOOLKILN_...``."""

    def __init__(self, setting: str, message: str) -> None:
        super().__init__(f"{setting}: {message}")
        self.setting = setting
        self.message = message


def _http_url(value: str | None) -> str | None:
    if value is None:
        return None
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http:// or https:// URL with a host")
    return value


class SandboxSettings(BaseSettings):
    """How a runner runs code: the settings a runner and the API's embedded runner share."""

    model_config = SettingsConfigDict(env_prefix="TOOLKILN_", extra="ignore")

    data_dir: Path = Path("./data")
    sandbox_warm: int = Field(8, ge=1, le=128)
    sandbox_memory_mb: int = Field(256, ge=32, le=4096)
    sandbox_insecure: bool = False
    sandbox_js_workers: int = Field(3, ge=1, le=64)
    log_format: Literal["text", "json"] = "text"
    # Isolation layers whose absence the operator accepts (sandbox/layers.py), comma-separated.
    sandbox_accept: str = ""
    # A cgroup delegated to the runner's user, below each controller's root (v1) or the
    # unified root (v2); empty: the root itself (a runner that is the host's root).
    sandbox_cgroup: str = ""
    # An unprivileged runner's user namespace: START:COUNT of its /etc/subuid and
    # /etc/subgid ranges (unset: its first range in each).
    sandbox_subuids: str | None = None

    @field_validator("sandbox_accept")
    @classmethod
    def _accept(cls, value: str) -> str:
        from toolkiln.sandbox.layers import parse_accept

        return ",".join(parse_accept(value))

    @field_validator("sandbox_cgroup")
    @classmethod
    def _cgroup(cls, value: str) -> str:
        parts = [p for p in value.strip("/").split("/") if p]
        if any(p in (".", "..") for p in parts):
            raise ValueError("must be a path below the cgroup roots, without . or ..")
        return "/".join(parts)

    @field_validator("sandbox_subuids")
    @classmethod
    def _subuids(cls, value: str | None) -> str | None:
        if value is None:
            return None
        start, _, count = value.partition(":")
        if not (start.isdigit() and count.isdigit() and int(count) > 0):
            raise ValueError("must be START:COUNT, a range of /etc/subuid and /etc/subgid")
        return value

    @property
    def accepted_layers(self) -> tuple[str, ...]:
        return tuple(n for n in self.sandbox_accept.split(",") if n)

    @property
    def packages_dir(self) -> Path:
        return (self.data_dir / "packages" / "python").resolve()

    @property
    def js_packages_dir(self) -> Path:
        return (self.data_dir / "packages" / "javascript").resolve()

    def sandbox_env(self) -> dict[str, str]:
        """These settings as the environment of a runner process the API starts itself."""
        return {
            "TOOLKILN_DATA_DIR": str(self.data_dir.resolve()),
            "TOOLKILN_SANDBOX_WARM": str(self.sandbox_warm),
            "TOOLKILN_SANDBOX_MEMORY_MB": str(self.sandbox_memory_mb),
            "TOOLKILN_SANDBOX_INSECURE": "true" if self.sandbox_insecure else "false",
            "TOOLKILN_SANDBOX_JS_WORKERS": str(self.sandbox_js_workers),
            "TOOLKILN_LOG_FORMAT": self.log_format,
            "TOOLKILN_SANDBOX_ACCEPT": self.sandbox_accept,
            "TOOLKILN_SANDBOX_CGROUP": self.sandbox_cgroup,
            **({"TOOLKILN_SANDBOX_SUBUIDS": self.sandbox_subuids} if self.sandbox_subuids else {}),
        }


class RunnerSettings(SandboxSettings):
    """``toolkiln runner``'s settings. A runner holds no credential but the runner credential
    itself: never the database URL, the model key, SMTP or search settings, signing keys or
    secrets; it does not read them."""

    runner_listen: str | None = None
    runner_token: SecretStr | None = None
    runner_tls_cert: Path | None = None
    runner_tls_key: Path | None = None
    runner_tls_client_ca: Path | None = None
    runner_drain_s: float = Field(40.0, gt=0, le=3600)


class Settings(SandboxSettings):
    """All configuration of the API. docs/configuration.md documents each field (and
    RunnerSettings'); a test keeps them in step."""

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=1, le=65535)
    database_url: str | None = None
    bootstrap_token: SecretStr | None = None
    metrics_token: SecretStr | None = None
    db_pool_size: int = Field(16, ge=1, le=256)
    # Runners: unset, `serve` starts one of its own on a Unix socket.
    runners: str | None = None
    runner_token: SecretStr | None = None
    runner_tls_ca: Path | None = None
    runner_tls_cert: Path | None = None
    runner_tls_key: Path | None = None
    public_url: str | None = None
    smtp_url: SecretStr | None = None
    search_provider: str | None = None
    search_url: str | None = None
    search_api_key: SecretStr | None = None
    file_signing_key: SecretStr | None = None
    llm_base_url: str | None = None
    llm_api_key: SecretStr | None = None
    llm_model: str | None = None
    llm_max_attempts: int = Field(3, ge=1, le=10)
    llm_timeout_s: float = Field(60.0, gt=0, le=600)
    llm_max_answer_bytes: int = Field(LLM_ANSWER_BYTES, ge=64 * 1024, le=256 * 1024 * 1024)
    long_work_per_workspace: int = Field(places.PER_WORKSPACE, ge=1, le=256)
    long_work_total: int = Field(places.TOTAL, ge=1, le=1024)
    files_per_workspace_mb: int = Field(256, ge=1, le=1024 * 1024)
    files_per_workspace: int = Field(10_000, ge=1, le=10_000_000)
    long_work_retry_after_s: int = Field(places.RETRY_AFTER_S, ge=1, le=3600)
    secrets_keys: SecretStr | None = None
    egress_ca_file: Path | None = None
    # A tool call's arguments and result in its trace span (traces: the OTEL_* variables).
    trace_tool_io: bool = False

    # Values checked here, not where they are first used, so that a wrong one is
    # `error: invalid_setting: TOOLKILN_X: ...` for every command, before anything starts
    # (docs/configuration.md), not a library's exception when the service is half built.

    @field_validator("database_url")
    @classmethod
    def _database_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        scheme = value.split("://", 1)[0] if "://" in value else ""
        if scheme.split("+", 1)[0] not in DATABASE_BACKENDS:
            raise ValueError(
                "must be a sqlite:///path or postgresql+psycopg://user@host:5432/db URL"
            )
        return value

    @field_validator("public_url", "llm_base_url", "search_url")
    @classmethod
    def _urls(cls, value: str | None) -> str | None:
        return _http_url(value)

    @field_validator("search_provider")
    @classmethod
    def _search_provider(cls, value: str | None) -> str | None:
        if value and value not in SEARCH_PROVIDERS:
            raise ValueError(f"unknown search provider {value!r}: use searxng or brave")
        return value or None

    @field_validator("smtp_url")
    @classmethod
    def _smtp_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value():
            return None
        parts = urlsplit(value.get_secret_value())
        if parts.scheme not in ("smtp", "smtps") or not parts.hostname:
            raise ValueError("must look like smtp://host:port or smtps://host:port")
        return value

    @field_validator("file_signing_key")
    @classmethod
    def _signing_key(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value().strip():
            # An empty HMAC key signs links anyone can make; unset, a key is generated.
            raise ValueError("must not be empty (leave it unset to generate one)")
        return value

    @field_validator("secrets_keys")
    @classmethod
    def _secrets_keys(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value().strip():
            return None
        for key in value.get_secret_value().split(","):
            parse_key(key)  # a ValueError names what is wrong, never the key
        return value

    @field_validator("egress_ca_file")
    @classmethod
    def _ca_file(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError("must be a PEM file of CA certificates")
        return value

    def secrets_key_list(self) -> list[str]:
        """The configured keys, newest first (none: one generated into the data dir)."""
        keys = self.secrets_keys.get_secret_value() if self.secrets_keys else ""
        return [k.strip() for k in keys.split(",") if k.strip()]

    @model_validator(mode="after")
    def _runners_need(self) -> Any:
        if self.runners and not self.runner_token:
            raise SettingError("TOOLKILN_RUNNER_TOKEN", "is required with TOOLKILN_RUNNERS")
        return self

    @model_validator(mode="after")
    def _search_needs(self) -> Any:
        if self.search_provider == "searxng" and not self.search_url:
            raise SettingError("TOOLKILN_SEARCH_URL", "is required for the searxng provider")
        if self.search_provider == "brave" and not self.search_api_key:
            raise SettingError("TOOLKILN_SEARCH_API_KEY", "is required for the brave provider")
        return self

    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'toolkiln.db').resolve()}"

    def resolved_public_url(self) -> str:
        return (self.public_url or f"http://{self.host}:{self.port}").rstrip("/")

    def legacy_signing_key(self) -> str | None:
        """The key an earlier version generated into the data dir, if any: the first replica
        to start with one seeds the shared key with it, so the links it made stay valid."""
        path = self.data_dir / "signing.key"
        if not path.exists():
            return None
        return path.read_text().strip() or None

    def ensure_data_dir(self) -> None:
        """Create the data directory and prove it writable (``data_dir_not_writable`` if
        not): a probe file is the only check that also holds for root and for read-only
        mounts."""
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            probe = self.data_dir / f".write-probe-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise ServiceUnavailable(
                f"The data directory {self.data_dir} is not writable ({exc.strerror or exc}).",
                code="data_dir_not_writable",
            ) from exc
