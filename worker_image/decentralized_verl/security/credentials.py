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
  wrongly signed weights;
- the DHT bootstrap peer's libp2p identity: random, its key held by the bootstrap alone, its peer id
  public (so the learner dials it from `host:port`, and no one who merely knows the job's name can be it).
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from decentralized_verl.errors import DverlError
from decentralized_verl.security.rights import TOKEN_ROLES

CA_FILE = "ca.crt"
CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
TOKEN_FILE = "token"
CALLERS_FILE = "callers"
VERIFY_KEY_FILE = "weights.pub"
SIGNING_KEY_FILE = "weights.key"
DHT_PEER_FILE = "dht.peer"
DHT_KEY_FILE = "dht.key"
DHT_ROLE = "dht"
PUBLIC_FILES = (CA_FILE, CERT_FILE, KEY_FILE, CALLERS_FILE, VERIFY_KEY_FILE, DHT_PEER_FILE)
"""What every process of the job gets; each also gets its own role's token, learners the signing key and
the DHT bootstrap its identity."""
VALID_DAYS = 365


class CredentialsError(DverlError):
    """Credentials missing, unreadable or not what they claim; the message names the file."""


def token_key(role: str) -> str:
    """The Secret key that holds `role`'s token (mounted into that role's pods as TOKEN_FILE)."""
    return f"{TOKEN_FILE}.{role}"


def token_digest(token: bytes) -> str:
    """What servers keep of a token: they recognise it without holding it."""
    return hashlib.sha256(token).hexdigest()


def callers_text(tokens: Mapping[str, bytes]) -> bytes:
    """The CALLERS_FILE: one `role sha256(token)` line per role."""
    return "".join(f"{role} {token_digest(tok)}\n" for role, tok in sorted(tokens.items())).encode()


def parse_callers(text: bytes, where: str) -> tuple[tuple[str, str], ...]:
    """(digest, role) pairs of a CALLERS_FILE; CredentialsError naming the line otherwise."""
    out = []
    for number, line in enumerate(text.decode(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 2 or parts[0] not in TOKEN_ROLES or len(parts[1]) != 64:
            raise CredentialsError(f"{where}: line {number}: expected `<role> <sha256 hex>` (got {line!r})")
        out.append((parts[1], parts[0]))
    return tuple(out)


@dataclass(frozen=True)
class JobCredentials:
    """What one process of the job holds: the job's public files, its own role's token, and (learners
    only) the weight-signing key."""

    ca: bytes
    """PEM certificate of the job's CA."""
    cert: bytes
    key: bytes
    token: bytes
    """Hex text this process presents on every call: its role's token."""
    verify_key: bytes
    """Raw 32-byte Ed25519 public key that checks weight manifests."""
    signing_key: bytes | None = None
    """Raw 32-byte Ed25519 private key (learners only)."""
    callers: tuple[tuple[str, str], ...] = ()
    """(sha256 of a token, role) for every role: who a server's caller is, from the token it presents."""
    role: str = ""
    """Whose token this process holds ("" for a process that holds none and calls nothing)."""
    dht_peer: str = ""
    """The peer id of the job's DHT bootstrap ("" in credentials issued before it had one)."""
    dht_seed: bytes | None = None
    """The bootstrap's identity (the bootstrap only)."""


@dataclass(frozen=True)
class IssuedCredentials:
    """Everything issued for a job, held only by the issuer (the operator, `dverl run`): one token per
    role, the signing key, and the files every process shares."""

    ca: bytes
    cert: bytes
    key: bytes
    verify_key: bytes
    signing_key: bytes
    tokens: Mapping[str, bytes]
    """role -> token (TOKEN_ROLES, each random, or the observer's derived by the operator)."""
    dht_seed: bytes = b""
    """The DHT bootstrap's identity (random; `security.peer_identity`)."""

    @property
    def dht_peer(self) -> str:
        from decentralized_verl.security.peer_identity import peer_id_of_seed  # noqa: PLC0415 light: cryptography; the operator's import path stays without it

        return peer_id_of_seed(self.dht_seed) if self.dht_seed else ""

    @property
    def callers(self) -> tuple[tuple[str, str], ...]:
        return parse_callers(callers_text(self.tokens), "issued credentials")

    def for_role(self, role: str) -> JobCredentials:
        """What a process of `role` holds; a role with no token (the DHT bootstrap) holds none."""
        return JobCredentials(
            self.ca, self.cert, self.key, self.tokens.get(role, b""), self.verify_key,
            self.signing_key if role == "learner" else None, self.callers,
            role if role in self.tokens else "", self.dht_peer,
            self.dht_seed if role == DHT_ROLE else None,
        )  # fmt: skip

    def public_files(self) -> dict[str, bytes]:
        return {
            CA_FILE: self.ca,
            CERT_FILE: self.cert,
            KEY_FILE: self.key,
            CALLERS_FILE: callers_text(self.tokens),
            VERIFY_KEY_FILE: self.verify_key,
            DHT_PEER_FILE: self.dht_peer.encode(),
        }

    def files(self, role: str) -> dict[str, bytes]:
        """File name -> content, as a pod of `role` mounts them: the public files, its own token, and
        the signing key for learners alone."""
        out = self.public_files()
        if role in self.tokens:
            out[TOKEN_FILE] = self.tokens[role]
        if role == "learner":
            out[SIGNING_KEY_FILE] = self.signing_key
        if role == DHT_ROLE:
            out[DHT_KEY_FILE] = self.dht_seed
        return out

    def secret_data(self) -> dict[str, bytes]:
        """The operator's Secret: every file, each role's token under its own key (a pod mounts its own)."""
        out = {**self.public_files(), SIGNING_KEY_FILE: self.signing_key, DHT_KEY_FILE: self.dht_seed}
        out.update({token_key(role): token for role, token in self.tokens.items()})
        return out


@dataclass(frozen=True)
class CallerCredentials:
    """All a caller needs: the CA that signed the job's servers and its token. The operator's Status
    client holds only these (the observer's token), for every job, without reading any job's Secret."""

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
    from cryptography import x509  # noqa: PLC0415 light: cryptography, where credentials are issued; the operator imports this module
    from cryptography.hazmat.primitives import hashes, serialization  # noqa: PLC0415 light: cryptography, where credentials are issued; the operator imports this module
    from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415 light: cryptography, where credentials are issued; the operator imports this module
    from cryptography.x509.oid import NameOID  # noqa: PLC0415 light: cryptography, where credentials are issued; the operator imports this module

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
    observer_token: bytes | None = None,
    now: datetime.datetime | None = None,
    hosts: Sequence[str] = (),
) -> IssuedCredentials:
    """Fresh credentials for `job`: a certificate for its servers signed by `authority` (default: a CA
    made for this job alone), a random token per role (the observer's given by the operator, which
    derives it from its own key) and a new weight-signing key pair. The certificate names the job's
    Service names, 127.0.0.1 and the IP addresses in `hosts` (the nodes of a Ray cluster the servers
    listen on)."""
    from cryptography import x509  # noqa: PLC0415 light: cryptography, where credentials are issued; the operator imports this module
    from cryptography.hazmat.primitives import hashes, serialization  # noqa: PLC0415 light: cryptography, where credentials are issued; the operator imports this module
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519  # noqa: PLC0415 light: cryptography, where credentials are issued; the operator imports this module
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID  # noqa: PLC0415 light: cryptography, where credentials are issued; the operator imports this module

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
    tokens = {role: secrets.token_hex(32).encode() for role in TOKEN_ROLES}
    if observer_token is not None:
        tokens["observer"] = observer_token
    return IssuedCredentials(
        ca=authority.cert,
        cert=cert.public_bytes(serialization.Encoding.PEM),
        key=key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
        verify_key=signing.public_key().public_bytes(raw, serialization.PublicFormat.Raw),
        signing_key=signing.private_bytes(raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()),
        tokens=tokens,
        dht_seed=secrets.token_bytes(32),
    )


def write_files(folder: Path, files: Mapping[str, bytes]) -> Path:
    """Files readable by this user only (folder 0700, files 0600)."""
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    for name, content in files.items():
        path = folder / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
        os.chmod(path, 0o600)
    return folder


def write(folder: Path, issued: IssuedCredentials, role: str) -> Path:
    """What a pod of `role` mounts, as files (tests start single processes of a role this way)."""
    return write_files(folder, issued.files(role))


def handed_secrets(role: str, credentials: JobCredentials) -> bytes:
    """What a launcher writes into the pipe a child reads its secrets from (`load(..., handed=)`)."""
    signing = credentials.signing_key.hex() if credentials.signing_key else ""
    holder = role if role in TOKEN_ROLES else ""  # the DHT bootstrap: no token, no rights
    dht = credentials.dht_seed.hex() if credentials.dht_seed else ""
    return f"{holder}\n{credentials.token.decode()}\n{signing}\n{dht}\n".encode()


def _parse_handed(handed: bytes) -> tuple[str, bytes, bytes | None, bytes | None]:
    lines = handed.decode(errors="replace").split("\n")
    if len(lines) < 3 or lines[0] not in (*TOKEN_ROLES, ""):
        raise CredentialsError("the secrets handed to this process are not `role, token, signing key` lines")
    try:
        signing = bytes.fromhex(lines[2]) if lines[2] else None
        dht = bytes.fromhex(lines[3]) if len(lines) > 3 and lines[3] else None
    except ValueError:
        raise CredentialsError("a key handed to this process is not hex") from None
    return lines[0], lines[1].strip().encode(), signing, dht


def read_handed(fd: int) -> bytes:
    """Everything written into the pipe `fd` (closed after), once, at the process's start."""
    chunks = []
    with os.fdopen(fd, "rb", closefd=True) as pipe:
        while chunk := pipe.read(4096):
            chunks.append(chunk)
            if sum(map(len, chunks)) > 65536:
                raise CredentialsError(f"fd {fd}: more than 64 KiB of handed secrets")
    return b"".join(chunks)


def load(folder: Path, handed: bytes | None = None) -> JobCredentials:
    """What a process was given: the job's public files in `folder`, and its role's token and (learners)
    the signing key either `handed` through a pipe by its launcher (`dverl run`: never on disk) or
    as files beside them (a pod's Secret mount, which holds only its own role's)."""

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
    callers = parse_callers(read(CALLERS_FILE), str(folder / CALLERS_FILE))
    if handed is not None:
        _, token, signing, dht_seed = _parse_handed(handed)
        where = "the handed secrets"
    else:
        signing = (folder / SIGNING_KEY_FILE).read_bytes() if (folder / SIGNING_KEY_FILE).exists() else None
        dht_seed = (folder / DHT_KEY_FILE).read_bytes() if (folder / DHT_KEY_FILE).exists() else None
        token = (folder / TOKEN_FILE).read_bytes().strip() if (folder / TOKEN_FILE).exists() else b""
        where = str(folder / TOKEN_FILE)
    if signing is not None and len(signing) != 32:
        raise CredentialsError(f"{folder / SIGNING_KEY_FILE}: expected a 32-byte Ed25519 private key")
    if token and len(token) < 32:
        raise CredentialsError(f"{where}: too short to be a job token")
    roles = dict(callers)
    role = roles.get(token_digest(token), "") if token else ""
    if token and not role:
        raise CredentialsError(f"{where}: the token is none of the roles in {folder / CALLERS_FILE}")
    if dht_seed is not None and len(dht_seed) != 32:
        raise CredentialsError(f"{folder / DHT_KEY_FILE}: expected a 32-byte identity seed")
    dht_peer = (folder / DHT_PEER_FILE).read_text().strip() if (folder / DHT_PEER_FILE).exists() else ""
    return JobCredentials(
        read(CA_FILE), read(CERT_FILE), read(KEY_FILE), token, verify, signing, callers, role, dht_peer,
        dht_seed,
    )  # fmt: skip


@dataclass(frozen=True)
class LocalCredentials:
    """`dverl run`'s credentials: the public files in one folder every process reads, and each role's
    token and the signing key in this process's memory alone, handed to each child through a pipe
    (`handed_secrets`). All of a run's processes run as one user, so no file could keep a rollout
    worker from the learner's key; memory of another process can (ptrace is denied to non-ancestors)."""

    folder: Path
    issued: IssuedCredentials

    def for_role(self, role: str) -> JobCredentials:
        return self.issued.for_role(role)

    def handed(self, role: str) -> bytes:
        return handed_secrets(role, self.for_role(role))


def certificate_ips(cert: bytes) -> set[str]:
    """The IP addresses a PEM server certificate names."""
    from cryptography import x509  # noqa: PLC0415 light: cryptography, where credentials are issued; the operator imports this module

    loaded = x509.load_pem_x509_certificate(cert)
    try:
        names = loaded.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return {str(ip) for ip in names.get_values_for_type(x509.IPAddress)}


def run_folder_credentials(output: Path, job: str, hosts: Sequence[str] = ()) -> LocalCredentials:
    """Fresh credentials for one `dverl run`, the public half in `<output>/secrets/` (0700/0600). A
    resumed run issues new ones: every process of the run starts again and is handed them, and nothing
    secret is left on disk between runs (an older run's signing key file is removed). The certificate
    also names `hosts` (a Ray cluster's node addresses, where the servers listen)."""
    secrets_dir = output / "secrets"
    for stale in (secrets_dir / "learner", secrets_dir / "worker"):  # an earlier layout held keys on disk
        if stale.is_dir():
            for path in stale.iterdir():
                path.unlink()
            stale.rmdir()
    issued = issue(job, "local", hosts=hosts)
    folder = write_files(secrets_dir / "job", issued.public_files())
    os.chmod(secrets_dir, 0o700)
    return LocalCredentials(folder, issued)
