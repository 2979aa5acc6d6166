"""Per-target command lines (argv lists) for ``decide deploy``: create, self-delete, watch, confirm gone.

Flags are the ones the installed Google Cloud CLI (528.0.0) and AWS CLI parse; tests run every command
through them. Facts behind the choices:

- v6e is a Compute Engine instance of machine type ``ct6e-standard-1t`` (one v6e chip) on the image
  family ``ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e`` (project ``ubuntu-os-accelerator-images``), as the
  reference study ran it; a TPU VM (``tpus tpu-vm create``) takes neither a machine type nor a boot
  disk size nor ``--max-run-duration``. ``FLEX_START`` is a choice of ``--provisioning-model`` only in
  ``gcloud alpha compute instances create`` (GA offers RESERVATION_BOUND, SPOT, STANDARD), and 528
  has no ``--request-valid-for-duration``, so a flex-start request waits as long as the API's default.
- v5e flex-start exists only as a queued resource, and ``--provisioning-model`` / ``--max-run-duration``
  only in ``gcloud alpha compute tpus queued-resources create``.
- g2-standard-4 carries one L4 (no ``--accelerator`` flag); the Ubuntu accelerator image family with the
  NVIDIA 580 driver is the one listed in 2026.
"""

from __future__ import annotations

from deploy.runfile import Run

V6E_MACHINE = "ct6e-standard-1t"
TPU_IMAGE_FAMILY = "ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e"
L4_GCP_MACHINE = "g2-standard-4"
L4_GCP_IMAGE_FAMILY = "ubuntu-accelerator-2204-amd64-with-nvidia-580"
ACCELERATOR_IMAGE_PROJECT = "ubuntu-os-accelerator-images"
BOOT_DISK = "200GB"
V5E_ACCELERATOR = "v5litepod-1"
V5E_RUNTIME = "v2-alpha-tpuv5-lite"
L4_AWS_INSTANCE = "g6.xlarge"
AWS_ROOT_DEVICE = "/dev/sda1"  # the Ubuntu Deep Learning AMIs' root device
LABEL = "opendecide-run"


def preflight_command(run: Run) -> list[str]:
    """Fails fast (before anything is billed) when the Hugging Face token secret is not there."""
    if run.platform == "aws":
        return [
            "aws",
            "secretsmanager",
            "describe-secret",
            "--region",
            run.aws.region,
            "--secret-id",
            run.hf_secret,
        ]
    return [
        "gcloud",
        "secrets",
        "versions",
        "describe",
        "latest",
        "--secret",
        run.hf_secret,
        "--project",
        run.project,
    ]


def create_command(run: Run, script_path: str) -> list[str]:
    """The one command that creates the machine with ``script_path`` as its startup script."""
    return {"v6e": _v6e, "v5e": _v5e, "l4-gcp": _l4_gcp, "l4-aws": _l4_aws}[run.target](run, script_path)


def _gce_instance(
    run: Run, script_path: str, *, machine: str, image_family: str, model: str, alpha: bool
) -> list[str]:
    return [
        "gcloud",
        *(["alpha"] if alpha else []),
        "compute",
        "instances",
        "create",
        run.name,
        "--project",
        run.project,
        "--zone",
        run.zone,
        "--machine-type",
        machine,
        "--image-family",
        image_family,
        "--image-project",
        ACCELERATOR_IMAGE_PROJECT,
        "--boot-disk-size",
        BOOT_DISK,
        "--scopes",
        "cloud-platform",
        "--maintenance-policy",
        "TERMINATE",
        "--provisioning-model",
        model,
        *(["--reservation-affinity", "none"] if model == "FLEX_START" else []),
        "--max-run-duration",
        run.max_run_duration,
        "--instance-termination-action",
        "DELETE",
        "--labels",
        f"{LABEL}={run.name}",
        "--metadata-from-file",
        f"startup-script={script_path}",
    ]


def _v6e(run: Run, script_path: str) -> list[str]:
    flex = run.provisioning == "flex-start"
    return _gce_instance(
        run,
        script_path,
        machine=V6E_MACHINE,
        image_family=TPU_IMAGE_FAMILY,
        model="FLEX_START" if flex else "STANDARD",
        alpha=flex,
    )


def _l4_gcp(run: Run, script_path: str) -> list[str]:
    return _gce_instance(
        run,
        script_path,
        machine=L4_GCP_MACHINE,
        image_family=L4_GCP_IMAGE_FAMILY,
        model="SPOT" if run.provisioning == "spot" else "STANDARD",
        alpha=False,
    )


def _v5e(run: Run, script_path: str) -> list[str]:
    return [
        "gcloud",
        "alpha",
        "compute",
        "tpus",
        "queued-resources",
        "create",
        run.name,
        "--project",
        run.project,
        "--zone",
        run.zone,
        "--node-id",
        f"{run.name}-node",
        "--accelerator-type",
        V5E_ACCELERATOR,
        "--runtime-version",
        V5E_RUNTIME,
        "--provisioning-model",
        "flex-start",
        "--max-run-duration",
        run.max_run_duration,
        "--valid-until-duration",
        run.valid_until_duration,
        "--scopes",
        "cloud-platform",
        "--labels",
        f"{LABEL}={run.name}",
        "--metadata-from-file",
        f"startup-script={script_path}",
    ]


def _l4_aws(run: Run, script_path: str) -> list[str]:
    aws = run.aws
    command = [
        "aws",
        "ec2",
        "run-instances",
        "--region",
        aws.region,
        "--image-id",
        aws.image_id,
        "--instance-type",
        L4_AWS_INSTANCE,
        "--count",
        "1",
        "--instance-initiated-shutdown-behavior",
        "terminate",
        "--iam-instance-profile",
        f"Name={aws.instance_profile}",
        "--block-device-mappings",
        f"DeviceName={AWS_ROOT_DEVICE},Ebs={{VolumeSize={BOOT_DISK.removesuffix('GB')},VolumeType=gp3,DeleteOnTermination=true}}",
        "--tag-specifications",
        f"ResourceType=instance,Tags=[{{Key=Name,Value={run.name}}},{{Key={LABEL},Value={run.name}}}]",
        "--user-data",
        f"file://{script_path}",
    ]
    if aws.key_name:
        command += ["--key-name", aws.key_name]
    if aws.security_group_ids:
        command += ["--security-group-ids", *aws.security_group_ids]
    if aws.subnet_id:
        command += ["--subnet-id", aws.subnet_id]
    return command


def self_delete_command(run: Run) -> list[str]:
    """What the startup script runs last, on the machine itself."""
    if run.target == "v5e":  # --force deletes the TPU node with its queued resource
        return [
            "gcloud",
            "compute",
            "tpus",
            "queued-resources",
            "delete",
            run.name,
            "--project",
            run.project,
            "--zone",
            run.zone,
            "--force",
            "--async",
            "--quiet",
        ]
    if run.platform == "aws":  # created with --instance-initiated-shutdown-behavior terminate
        return ["shutdown", "-h", "now"]
    return [
        "gcloud",
        "compute",
        "instances",
        "delete",
        run.name,
        "--project",
        run.project,
        "--zone",
        run.zone,
        "--quiet",
    ]


def watch_command(run: Run) -> list[str]:
    """Shows the startup script's log lines from the machine's serial console."""
    if run.target == "v5e":
        return [
            "gcloud",
            "alpha",
            "compute",
            "tpus",
            "queued-resources",
            "describe",
            run.name,
            "--project",
            run.project,
            "--zone",
            run.zone,
        ]
    if run.platform == "aws":
        return [
            "aws",
            "ec2",
            "describe-instances",
            "--region",
            run.aws.region,
            "--filters",
            f"Name=tag:{LABEL},Values={run.name}",
            "--query",
            "Reservations[].Instances[].[InstanceId,State.Name]",
            "--output",
            "text",
        ]
    return [
        "gcloud",
        "compute",
        "instances",
        "get-serial-port-output",
        run.name,
        "--project",
        run.project,
        "--zone",
        run.zone,
    ]


def gone_command(run: Run) -> list[str]:
    """Lists what is left of the run: empty output means nothing is billed any more."""
    if run.target == "v5e":
        return [
            "gcloud",
            "compute",
            "tpus",
            "queued-resources",
            "list",
            "--project",
            run.project,
            "--zone",
            run.zone,
            "--filter",
            f"name~{run.name}$",
        ]
    if run.platform == "aws":
        return [
            "aws",
            "ec2",
            "describe-instances",
            "--region",
            run.aws.region,
            "--filters",
            f"Name=tag:{LABEL},Values={run.name}",
            "Name=instance-state-name,Values=pending,running,shutting-down,stopping,stopped",
            "--query",
            "Reservations[].Instances[].InstanceId",
            "--output",
            "text",
        ]
    return [
        "gcloud",
        "compute",
        "instances",
        "list",
        "--project",
        run.project,
        "--filter",
        f"name={run.name}",
    ]
