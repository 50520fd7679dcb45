#!/usr/bin/env python3
"""Assemble and check the signer's container image as an OCI image layout, without an engine.

The image is what images/signer/Containerfile builds: one layer holding
/usr/local/bin/node-attestation-signer (a static musl binary), /etc/passwd and /etc/group
(the nonroot user 65532), and nothing else: no shell, no libc, no package manager. The layer
is reproducible (sorted entries, zero mtimes, uid/gid 0, gzip without a timestamp), so the
same binary always gives the same digests.

  oci_layout.py build --binary PATH --tag TAG --out image.tar   # OCI layout, as a tarball
  oci_layout.py check image.tar [--max-mib N]                   # inspect it; exit 1 on a fault

Only the Python standard library is used.
"""

import argparse
import gzip
import hashlib
import io
import json
import os
import sys
import tarfile

HERE = os.path.dirname(os.path.abspath(__file__))
ENTRYPOINT = "/usr/local/bin/node-attestation-signer"
USER = "65532:65532"
LAYER_FILES = {
    "etc/group": (os.path.join(HERE, "rootfs/etc/group"), 0o644),
    "etc/passwd": (os.path.join(HERE, "rootfs/etc/passwd"), 0o644),
    "usr/local/bin/node-attestation-signer": (None, 0o755),
}
DIRS = ["etc", "usr", "usr/local", "usr/local/bin"]


def sha256(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def layer_tar(binary):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in DIRS:
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
            tar.addfile(info)
        for name in sorted(LAYER_FILES):
            source, mode = LAYER_FILES[name]
            with open(source or binary, "rb") as f:
                data = f.read()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, 0
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def gzip_bytes(data):
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0, compresslevel=9) as gz:
        gz.write(data)
    return out.getvalue()


def build(args):
    with open(args.binary, "rb") as f:
        head = f.read(4)
    if head != b"\x7fELF":
        sys.exit(f"{args.binary} is not an ELF binary")
    raw = layer_tar(args.binary)
    layer = gzip_bytes(raw)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "User": USER,
            "Entrypoint": [ENTRYPOINT],
            "Cmd": ["run"],
            "Env": ["PATH=/usr/local/bin"],
            "Labels": {
                "org.opencontainers.image.title": "node-attestation-signer",
                "org.opencontainers.image.description": "Approves and signs attested kubelet CSRs for Cluster API workload clusters",
                "org.opencontainers.image.licenses": "Apache-2.0",
            },
        },
        "rootfs": {"type": "layers", "diff_ids": [sha256(raw)]},
        "history": [{"created_by": "images/signer/oci_layout.py: static binary, passwd, group"}],
    }
    config_bytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": sha256(config_bytes), "size": len(config_bytes)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": sha256(layer), "size": len(layer)}],
    }
    manifest_bytes = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": sha256(manifest_bytes),
            "size": len(manifest_bytes),
            "annotations": {"org.opencontainers.image.ref.name": args.tag},
            "platform": {"architecture": "amd64", "os": "linux"},
        }],
    }
    entries = {
        "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
        "index.json": json.dumps(index, sort_keys=True, separators=(",", ":")).encode(),
    }
    for blob in (config_bytes, manifest_bytes, layer):
        entries["blobs/sha256/" + hashlib.sha256(blob).hexdigest()] = blob
    with tarfile.open(args.out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in ["blobs", "blobs/sha256"]:
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
            tar.addfile(info)
        for name in sorted(entries):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(entries[name]), 0o644, 0
            tar.addfile(info, io.BytesIO(entries[name]))
    print(f"{args.out}: {args.tag} manifest {sha256(manifest_bytes)}, layer {len(layer) / 1048576:.1f} MiB compressed")


def check(args):
    faults = []
    with tarfile.open(args.image) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}

    def blob(digest):
        data = files.get("blobs/sha256/" + digest.split(":", 1)[1])
        if data is None:
            faults.append(f"blob {digest} missing")
            return b""
        if sha256(data) != digest:
            faults.append(f"blob {digest} does not match its digest")
        return data

    if json.loads(files.get("oci-layout", b"{}")).get("imageLayoutVersion") != "1.0.0":
        faults.append("oci-layout missing or not 1.0.0")
    index = json.loads(files["index.json"])
    [descriptor] = index["manifests"]
    manifest = json.loads(blob(descriptor["digest"]))
    config = json.loads(blob(manifest["config"]["digest"]))
    c = config["config"]
    user = c.get("User", "")
    if not user or user.split(":")[0] in ("", "0", "root"):
        faults.append(f"runs as {user!r}: must be a non-root uid")
    if c.get("Entrypoint") != [ENTRYPOINT]:
        faults.append(f"entrypoint {c.get('Entrypoint')!r}")
    if config.get("os") != "linux" or config.get("architecture") != "amd64":
        faults.append("not linux/amd64")
    [layer_desc] = manifest["layers"]
    layer = blob(layer_desc["digest"])
    raw = gzip.decompress(layer)
    if config["rootfs"]["diff_ids"] != [sha256(raw)]:
        faults.append("diff_id does not match the layer")
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        members = {m.name: m for m in tar.getmembers()}
        regular = sorted(n for n, m in members.items() if m.isfile())
        if regular != sorted(LAYER_FILES):
            faults.append(f"layer holds {regular}, expected exactly {sorted(LAYER_FILES)}")
        for shell in ("bin/sh", "bin/bash", "bin/busybox"):
            if shell in members:
                faults.append(f"{shell} present: the image must have no shell")
        binary = members.get(ENTRYPOINT.lstrip("/"))
        if binary is None or not binary.mode & 0o111:
            faults.append("the entrypoint is missing or not executable")
        else:
            elf = tar.extractfile(binary).read()
            if elf[:4] != b"\x7fELF":
                faults.append("the entrypoint is not ELF")
            if has_interpreter(elf):
                faults.append("the entrypoint is dynamically linked (has PT_INTERP): it needs a libc the image lacks")
        passwd = tar.extractfile(members["etc/passwd"]).read().decode()
        uid = user.split(":")[0]
        if not any(line.split(":")[2] == uid for line in passwd.splitlines() if line.count(":") >= 6):
            faults.append(f"uid {uid} has no /etc/passwd entry")
    size = sum(len(v) for v in files.values())
    if size > args.max_mib * 1048576:
        faults.append(f"image is {size / 1048576:.1f} MiB, over {args.max_mib} MiB")
    for fault in faults:
        print(f"FAULT: {fault}")
    if faults:
        sys.exit(1)
    ref = descriptor.get("annotations", {}).get("org.opencontainers.image.ref.name")
    print(f"{args.image}: {ref}, user {user}, entrypoint {c['Entrypoint']} {c.get('Cmd')}, "
          f"files {regular}, static, {size / 1048576:.1f} MiB: ok")


def has_interpreter(elf):
    """True when the ELF64 little-endian binary has a PT_INTERP program header."""
    if len(elf) < 64 or elf[4] != 2 or elf[5] != 1:
        return False
    phoff = int.from_bytes(elf[32:40], "little")
    phentsize = int.from_bytes(elf[54:56], "little")
    phnum = int.from_bytes(elf[56:58], "little")
    for i in range(phnum):
        start = phoff + i * phentsize
        if int.from_bytes(elf[start:start + 4], "little") == 3:  # PT_INTERP
            return True
    return False


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build")
    b.add_argument("--binary", required=True)
    b.add_argument("--tag", default="node-attestation-signer:0.1.0")
    b.add_argument("--out", required=True)
    c = sub.add_parser("check")
    c.add_argument("image")
    c.add_argument("--max-mib", type=float, default=20)
    args = parser.parse_args()
    build(args) if args.command == "build" else check(args)


if __name__ == "__main__":
    main()
