"""A job's credentials: issued once (by the operator into a Secret, or by `dverl run` into the run folder),
read by every process of the job.

- a CA that signs the job's certificate: made for the run and thrown away after issuing (`dverl run`),
  or the operator's own (`Authority`, in its identity Secret), which its Status client then trusts;
- one certificate + key for every process of the job's servers, valid for each pod's Service DNS name
  (`*.<job>-workers.<namespace>.svc[.cluster.local]`), `localhost` and 127.0.0.1: callers verify they talk
  to the job (TLS), and the traffic is encrypted;
- a job token every caller presents on every call, checked by the servers (`transport.secure`): random
  for `dverl run`, derived from the operator's key in a cluster;
- an Ed25519 key pair for weights: the learner signs every weight manifest with the private half, which
  only learner processes receive; every other process gets the public half and refuses unsigned or
  wrongly signed weights.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from decentralized_verl.errors import DverlError

CA_FILE = "ca.crt"
CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
TOKEN_FILE = "token"
VERIFY_KEY_FILE = "weights.pub"
SIGNING_KEY_FILE = "weights.key"
WORKER_FILES = (CA_FILE, CERT_FILE, KEY_FILE, TOKEN_FILE, VERIFY_KEY_FILE)
"""What every process of the job gets; learners get SIGNING_KEY_FILE too."""
VALID_DAYS = 365


class CredentialsError(DverlError):
    """Credentials missing, unreadable or not what they claim; the message names the file."""


@dataclass(frozen=True)
class JobCredentials:
    ca: bytes
    """PEM certificate of the job's CA."""
    cert: bytes
    key: bytes
    token: bytes
    """Hex text a caller presents on every call."""
    verify_key: bytes
    """Raw 32-byte Ed25519 public key that checks weight manifests."""
    signing_key: bytes | None = None
    """Raw 32-byte Ed25519 private key (learners only)."""

    def files(self, *, signing: bool) -> dict[str, bytes]:
        """File name -> content, as a Secret's data or a folder holds them."""
        out = {
            CA_FILE: self.ca,
            CERT_FILE: self.cert,
            KEY_FILE: self.key,
            TOKEN_FILE: self.token,
            VERIFY_KEY_FILE: self.verify_key,
        }
        if signing and self.signing_key is not None:
            out[SIGNING_KEY_FILE] = self.signing_key
        return out


@dataclass(frozen=True)
class CallerCredentials:
    """All a caller needs: the CA that signed the job's servers and the job token. The operator's Status
    client holds only these, for every job, without reading any job's Secret."""

    ca: bytes
    token: bytes


def dns_names(job: str, namespace: str) -> list[str]:
    service = f"{job}-workers.{namespace}.svc"
    return [f"*.{service}", f"*.{service}.cluster.local", service, "localhost"]


@dataclass(frozen=True)
class Authority:
    """A CA that signs job certificates: one per `dverl run` (thrown away after issuing), or the
    operator's own, kept in its identity Secret, so it can check every job's servers without reading
    their Secrets."""

    cert: bytes
    """PEM certificate."""
    key: bytes
    """PEM (PKCS#8) private key."""


def _validity(now: datetime.datetime | None) -> tuple[datetime.datetime, datetime.datetime]:
    now = now or datetime.datetime.now(datetime.UTC)
    return now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=VALID_DAYS)


def new_authority(common_name: str, *, now: datetime.datetime | None = None) -> Authority:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    start, end = _validity(now)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end + datetime.timedelta(days=VALID_DAYS))  # outlives the certificates it signs
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    pem = serialization.Encoding.PEM
    return Authority(
        cert.public_bytes(pem),
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )


def issue(
    job: str,
    namespace: str = "default",
    *,
    authority: Authority | None = None,
    token: bytes | None = None,
    now: datetime.datetime | None = None,
    hosts: Sequence[str] = (),
) -> JobCredentials:
    """Fresh credentials for `job`: a certificate for its servers signed by `authority` (default: a CA
    made for this job alone), `token` (default: random) and a new weight-signing key pair. The
    certificate names the job's Service names, 127.0.0.1 and the IP addresses in `hosts` (the nodes of
    a Ray cluster the servers listen on)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    authority = authority or new_authority(f"dverl job {job} CA", now=now)
    ca_cert = x509.load_pem_x509_certificate(authority.cert)
    ca_key = serialization.load_pem_private_key(authority.key, password=None)
    start, end = _validity(now)
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names(job, namespace)]
    for host in dict.fromkeys(["127.0.0.1", *hosts]):
        names.append(x509.IPAddress(ipaddress.ip_address(host)))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{job}.{namespace}")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    signing = ed25519.Ed25519PrivateKey.generate()
    raw = serialization.Encoding.Raw
    return JobCredentials(
        ca=authority.cert,
        cert=cert.public_bytes(serialization.Encoding.PEM),
        key=key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
        token=token if token is not None else secrets.token_hex(32).encode(),
        verify_key=signing.public_key().public_bytes(raw, serialization.PublicFormat.Raw),
        signing_key=signing.private_bytes(raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()),
    )


def write(folder: Path, credentials: JobCredentials, *, signing: bool) -> Path:
    """The credentials as files readable by this user only (folder 0700, files 0600)."""
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    for name, content in credentials.files(signing=signing).items():
        path = folder / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
        os.chmod(path, 0o600)
    return folder


def load(folder: Path) -> JobCredentials:
    """What a process was given; the signing key only where it is present (learners)."""

    def read(name: str) -> bytes:
        try:
            return (folder / name).read_bytes()
        except OSError as exc:
            raise CredentialsError(
                f"{folder / name}: cannot read the job's credentials ({exc.strerror})"
            ) from None

    verify = read(VERIFY_KEY_FILE)
    if len(verify) != 32:
        raise CredentialsError(f"{folder / VERIFY_KEY_FILE}: expected a 32-byte Ed25519 public key")
    signing = (folder / SIGNING_KEY_FILE).read_bytes() if (folder / SIGNING_KEY_FILE).exists() else None
    if signing is not None and len(signing) != 32:
        raise CredentialsError(f"{folder / SIGNING_KEY_FILE}: expected a 32-byte Ed25519 private key")
    token = read(TOKEN_FILE).strip()
    if len(token) < 32:
        raise CredentialsError(f"{folder / TOKEN_FILE}: too short to be a job token")
    return JobCredentials(read(CA_FILE), read(CERT_FILE), read(KEY_FILE), token, verify, signing)


@dataclass(frozen=True)
class CredentialFolders:
    """Where a run's processes find their credentials: learners one folder (with the signing key), every
    other process another (without it)."""

    learner: Path
    worker: Path

    def for_role(self, role: str) -> Path:
        return self.learner if role == "learner" else self.worker


def certificate_ips(cert: bytes) -> set[str]:
    """The IP addresses a PEM server certificate names."""
    from cryptography import x509

    loaded = x509.load_pem_x509_certificate(cert)
    try:
        names = loaded.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return {str(ip) for ip in names.get_values_for_type(x509.IPAddress)}


def run_folder_credentials(output: Path, job: str, hosts: Sequence[str] = ()) -> CredentialFolders:
    """`dverl run`'s credentials, in `<output>/secrets/` (0700/0600): issued on the first run, the same
    ones again on a resumed run (a restarted learner signs with the key its workers already trust),
    unless their certificate lacks one of `hosts` (a Ray cluster's node addresses): then new ones."""
    folders = CredentialFolders(output / "secrets" / "learner", output / "secrets" / "worker")
    try:
        learner = load(folders.learner)
        load(folders.worker)
        if set(hosts) <= certificate_ips(learner.cert):
            return folders
    except CredentialsError:
        pass
    credentials = issue(job, "local", hosts=hosts)
    write(folders.learner, credentials, signing=True)
    write(folders.worker, credentials, signing=False)
    os.chmod(output / "secrets", 0o700)
    return folders
