#!/usr/bin/env bash
# The startup script of a `decide deploy` run, rendered by deploy/startup.py (only the settings block
# changes). On first boot, as root: the Hugging Face token from the secret store (never from metadata),
# the vLLM image and the decision service image by digest, each model served until /v1/models answers,
# the service in front of it, the optional eval, then the run directory uploaded and the machine (or its
# queued resource) deleted. Each step logs one timestamped line to $RUN_DIR/deploy.log, which is uploaded.
set -uo pipefail

# --- settings (rendered by deploy/startup.py; these example values keep the template checkable) ---
RUN_NAME=example
PLATFORM=gcp
ACCELERATOR=tpu
AWS_REGION=
BUCKET=gs://example-bucket/opendecide
HF_SECRET=hf-token
MAX_RUN_SECONDS=14400
ENGINE_IMAGE=vllm/vllm-tpu@sha256:19a1a0526476f902eb83e1057f3d8938f35b457dd7716a30e9ab4f7bee90d507
SERVICE_IMAGE=example.invalid/opendecide@sha256:0000000000000000000000000000000000000000000000000000000000000000
ENGINE_DOCKER_FLAGS=(--privileged --shm-size 16gb)
ENGINE_COMMAND=(vllm serve)
MODELS=(google/gemma-4-E2B-it)
MODEL_TAGS=(google_gemma-4-E2B-it)
MODEL_SOURCES=(google/gemma-4-E2B-it)
MODEL_LOAD=(google/gemma-4-E2B-it)
MODEL_PREP=('')
MODEL_MEASURE=('read generation')
PATCHES=
# shellcheck disable=SC2034  # read through a nameref in serve_model
SERVE_FLAGS_0=(--max-model-len 2048 --max-num-seqs 16 --max-logprobs 32 --generation-config vllm --enable-prefix-caching --enable-prompt-tokens-details)
SERVICE_FLAGS=(--host 0.0.0.0 --port 8080 --engine vllm --engine-url http://127.0.0.1:8000)
EVAL_RUN=
EVAL_DATA=
EVAL_ARGS=()
GEN_TASKS=()
GEN_ARGS=()
GEN_THROUGHPUT=
SELF_DELETE=(gcloud compute instances delete example --zone europe-west4-a --quiet)
# --- end settings ---

# Overridable only so tests can run this script unprivileged in a scratch directory.
WORK=${OPENDECIDE_WORK:-/opt/opendecide}
CONSOLE=${OPENDECIDE_CONSOLE:-/dev/console}
RUN_DIR=$WORK/run
DATA_DIR=$WORK/data
BUILDS_DIR=$WORK/builds  # repacked builds, mounted into the engine at /builds
WHEELS_DIR=$WORK/wheels  # the TPU patches plugin's wheel, mounted into the engine at /wheels
HF_ENGINE=$WORK/hf-engine
HF_SERVICE=$WORK/hf-service
SERVICE_UID=10001  # the USER of deploy/service.Dockerfile: it writes eval results into $RUN_DIR
ENGINE_URL=http://127.0.0.1:8000
SERVICE_URL=http://127.0.0.1:8080
READY_TIMEOUT_S=1800
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
DEST=$BUCKET/$RUN_NAME/$STAMP

mkdir -p "$RUN_DIR" "$DATA_DIR" "$BUILDS_DIR" "$WHEELS_DIR" "$HF_ENGINE" "$HF_SERVICE"
chown "$SERVICE_UID" "$RUN_DIR" "$HF_SERVICE" "$BUILDS_DIR"
exec > >(tee -a "$RUN_DIR/startup.out" "$CONSOLE") 2>&1

log() { echo "[opendecide $(date -u +%FT%TZ)] $*" | tee -a "$RUN_DIR/deploy.log"; }
elapsed() { echo $(( $(date +%s) - $1 )); }
metadata() { curl -sf -H 'Metadata-Flavor: Google' "http://metadata.google.internal/computeMetadata/v1/$1"; }

# The token goes into this shell's environment only; containers get it with `-e HF_TOKEN` (no value on
# any command line). Retried for ten minutes so an IAM grant made after the create still lands.
fetch_hf_token() {
  local attempt token=""
  for attempt in $(seq 1 30); do
    if [ "$PLATFORM" = aws ]; then
      token=$(aws secretsmanager get-secret-value --region "$AWS_REGION" --secret-id "$HF_SECRET" \
        --query SecretString --output text 2>/dev/null) || token=""
    else
      token=$(gcp_secret "$HF_SECRET") || token=""
    fi
    [ -n "$token" ] && break
    log "secret $HF_SECRET not readable yet (attempt $attempt of 30)"
    sleep 20
  done
  [ -n "$token" ] || return 1
  HF_TOKEN=$token
  export HF_TOKEN
}

gcp_secret() {
  local project access
  project=$(metadata project/project-id) || return 1
  access=$(metadata instance/service-accounts/default/token \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["access_token"])') || return 1
  curl -sf -H "Authorization: Bearer $access" \
    "https://secretmanager.googleapis.com/v1/projects/$project/secrets/$1/versions/latest:access" \
    | python3 -c 'import base64, json, sys; print(base64.b64decode(json.load(sys.stdin)["payload"]["data"]).decode())'
}

# The Compute Engine TPU image ships without Docker; GPU images need NVIDIA's container runtime.
ensure_docker() {
  if ! command -v docker >/dev/null; then
    log "installing docker.io"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null || return 1
  fi
  if [ "$ACCELERATOR" = gpu ] && ! docker info 2>/dev/null | grep -qi nvidia; then
    log "installing the NVIDIA container toolkit"
    curl -fsSL https://nvidia.github.io/libnvidia-container/gpgkey \
      | gpg --dearmor --yes -o /usr/share/keyrings/nvidia-container-toolkit-keyring.gpg || return 1
    curl -fsSL https://nvidia.github.io/libnvidia-container/stable/deb/nvidia-container-toolkit.list \
      | sed 's#deb https://#deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg] https://#g' \
      > /etc/apt/sources.list.d/nvidia-container-toolkit.list || return 1
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nvidia-container-toolkit >/dev/null || return 1
    nvidia-ctk runtime configure --runtime=docker >/dev/null && systemctl restart docker
  fi
}

# Private registries the machine's own identity can read: Artifact Registry / gcr.io on GCP, ECR on AWS.
registry_login() {
  local host=${SERVICE_IMAGE%%/*}
  case $host in
    *-docker.pkg.dev | gcr.io | *.gcr.io)
      gcloud auth configure-docker "$host" --quiet >/dev/null 2>&1 ;;
    *.dkr.ecr.*.amazonaws.com)
      aws ecr get-login-password --region "$AWS_REGION" | docker login --username AWS --password-stdin "$host" >/dev/null ;;
  esac
}

pull() {
  docker pull -q "$1" >/dev/null || return 1
  log "pulled $(docker inspect --format '{{index .RepoDigests 0}}' "$1")"
}

copy_in() {
  case $1 in
    s3://*) aws s3 cp --recursive --only-show-errors "$1" "$2" ;;
    *) gcloud storage rsync -r "$1" "$2" ;;
  esac
}

# A repacked arm's build on the machine's disk, before its engine starts: copied from the bucket, or
# the checkpoint downloaded and repacked by the service image's `decide repack` (deploy/repack.py). The
# build's manifest (source revision, checksums, counts) goes into the arm's folder.
prepare_model() {
  local source=${MODEL_SOURCES[$1]} tag=${MODEL_TAGS[$1]} prep=${MODEL_PREP[$1]} start
  local -a args
  [ -z "$prep" ] && return 0
  mkdir -p "$RUN_DIR/$tag" && chown "$SERVICE_UID" "$RUN_DIR/$tag"
  start=$(date +%s)
  case $prep in
    pull\ *)
      log "copying the build ${prep#pull } for $tag"
      copy_in "${prep#pull }" "$BUILDS_DIR/$tag" || { log "FAILED $tag: could not copy ${prep#pull }"; return 1; } ;;
    repack\ *)
      read -r -a args <<< "${prep#repack }"
      log "downloading $source and repacking it (${args[*]}) for $tag"
      if ! docker run --rm --net=host -e HF_TOKEN -e HF_HOME=/hf -v "$HF_SERVICE:/hf" -v "$BUILDS_DIR:/builds" \
        --entrypoint python "$SERVICE_IMAGE" -c \
        'import sys; from huggingface_hub import snapshot_download; snapshot_download(sys.argv[1], local_dir=sys.argv[2])' \
        "$source" "/builds/source-$tag" > "$RUN_DIR/$tag/repack.log" 2>&1; then
        log "FAILED $tag: could not download $source (see $tag/repack.log)"; return 1
      fi
      if ! docker run --rm -v "$BUILDS_DIR:/builds" "$SERVICE_IMAGE" \
        repack "${args[0]}" "/builds/source-$tag" "/builds/$tag" "${args[@]:1}" >> "$RUN_DIR/$tag/repack.log" 2>&1; then
        log "FAILED $tag: decide repack ${args[*]} (see $tag/repack.log)"; return 1
      fi
      rm -rf "${BUILDS_DIR:?}/source-$tag" ;;
  esac
  cp "$BUILDS_DIR/$tag/opendecide-repack.json" "$RUN_DIR/$tag/" 2>/dev/null
  log "build $tag ready after $(elapsed "$start")s"
}

measures() { [[ " ${MODEL_MEASURE[$1]} " == *" $2 "* ]]; }

serve_model() {
  local model=${MODELS[$1]} tag=${MODEL_TAGS[$1]} start
  local -n flags="SERVE_FLAGS_$1"
  mkdir -p "$RUN_DIR/$tag" && chown "$SERVICE_UID" "$RUN_DIR/$tag"
  docker rm -f vllm >/dev/null 2>&1
  log "serving $model"
  docker run -d --name vllm --net=host "${ENGINE_DOCKER_FLAGS[@]}" -e HF_TOKEN -e HF_HOME=/hf -v "$HF_ENGINE:/hf" \
    -v "$BUILDS_DIR:/builds:ro" -v "$WHEELS_DIR:/wheels:ro" \
    "$ENGINE_IMAGE" "${ENGINE_COMMAND[@]}" "${MODEL_LOAD[$1]}" --served-model-name "$model" --host 127.0.0.1 --port 8000 \
    "${flags[@]}" >/dev/null || { log "FAILED $model: the engine container did not start"; return 1; }
  start=$(date +%s)
  until curl -sf "$ENGINE_URL/v1/models" | grep -q '"id"'; do
    if [ -z "$(docker ps -q -f name=^vllm$)" ] || [ "$(elapsed "$start")" -gt "$READY_TIMEOUT_S" ]; then
      docker logs vllm > "$RUN_DIR/$tag/engine.log" 2>&1
      log "FAILED $model after $(elapsed "$start")s: $(grep -aoE '[A-Za-z_.]*(Error|Exception): .*' "$RUN_DIR/$tag/engine.log" | tail -1 | cut -c1-300)"
      return 1
    fi
    sleep 10
  done
  docker logs vllm > "$RUN_DIR/$tag/engine.log" 2>&1
  log "READY $model after $(elapsed "$start")s"
}

start_service() {
  local model=${MODELS[$1]} start
  docker rm -f decide-service >/dev/null 2>&1
  docker run -d --name decide-service --net=host -e HF_TOKEN -e HF_HOME=/hf -v "$HF_SERVICE:/hf" \
    -v "$RUN_DIR:/out" -v "$DATA_DIR:/data:ro" "$SERVICE_IMAGE" \
    serve "${SERVICE_FLAGS[@]}" --tokenizer "${MODEL_SOURCES[$1]}" --engine-image "$ENGINE_IMAGE" --service-image "$SERVICE_IMAGE" \
    >/dev/null || { log "FAILED service for $model: the container did not start"; return 1; }
  start=$(date +%s)
  # Any HTTP answer means it is up (an auth-protected /v1/models answers 401).
  until [ "$(curl -s -o /dev/null -w '%{http_code}' "$SERVICE_URL/v1/models")" != 000 ]; do
    if [ -z "$(docker ps -q -f name=^decide-service$)" ] || [ "$(elapsed "$start")" -gt 600 ]; then
      docker logs decide-service > "$RUN_DIR/${MODEL_TAGS[$1]}/service.log" 2>&1
      log "FAILED service for $model after $(elapsed "$start")s"
      return 1
    fi
    sleep 5
  done
  log "SERVICE READY $model after $(elapsed "$start")s"
}

run_eval() {
  local model=${MODELS[$1]} tag=${MODEL_TAGS[$1]} start status
  local out=/out/$tag/eval-$EVAL_RUN
  local -a images=(--engine-image "$ENGINE_IMAGE" --service-image "$SERVICE_IMAGE")
  local -a command
  case $EVAL_RUN in
    tasks) command=(decide eval tasks --out "$out" --engine "vllm@$ENGINE_URL" --engine-log "/out/$tag/engine.log" "${images[@]}") ;;
    suite) command=(decide eval suite --data /data --out "$out" --engine "vllm@$ENGINE_URL" --engine-log "/out/$tag/engine.log" "${images[@]}") ;;
    load) command=(decide eval load --out "$out" --engine "vllm@$ENGINE_URL") ;;
  esac
  log "eval $EVAL_RUN on $model"
  start=$(date +%s)
  docker exec decide-service "${command[@]}" "${EVAL_ARGS[@]}" > "$RUN_DIR/$tag/eval.log" 2>&1
  status=$?
  log "eval $EVAL_RUN on $model: exit $status after $(elapsed "$start")s"
}

run_load() {
  local model=${MODELS[$1]} tag=${MODEL_TAGS[$1]} start status
  log "load on $model"
  start=$(date +%s)
  docker exec decide-service decide eval load --out "/out/$tag/load" --engine "vllm@$ENGINE_URL" \
    > "$RUN_DIR/$tag/load.log" 2>&1
  status=$?
  log "load on $model: exit $status after $(elapsed "$start")s"
}

# The generation arms: each task through the service container's `decide eval generate` against the
# engine, then the throughput sweep; one folder each under the model's.
run_generate() {
  local model=${MODELS[$1]} tag=${MODEL_TAGS[$1]} task start status
  local -a images=(--engine-image "$ENGINE_IMAGE" --service-image "$SERVICE_IMAGE")
  for task in "${GEN_TASKS[@]}"; do
    log "generate $task on $model"
    start=$(date +%s)
    docker exec decide-service decide eval generate --task "$task" --engine-url "$ENGINE_URL" \
      --out "/out/$tag/generate-$task" "${images[@]}" "${GEN_ARGS[@]}" > "$RUN_DIR/$tag/generate-$task.log" 2>&1
    status=$?
    log "generate $task on $model: exit $status after $(elapsed "$start")s"
  done
  if [ -n "$GEN_THROUGHPUT" ]; then
    log "throughput on $model"
    start=$(date +%s)
    docker logs vllm > "$RUN_DIR/$tag/engine.log" 2>&1
    docker exec decide-service decide eval throughput --engine-url "$ENGINE_URL" --out "/out/$tag/throughput" \
      --engine-log "/out/$tag/engine.log" "${images[@]}" > "$RUN_DIR/$tag/throughput.log" 2>&1
    status=$?
    log "throughput on $model: exit $status after $(elapsed "$start")s"
  fi
}

stop_model() {
  local tag=${MODEL_TAGS[$1]}
  docker logs vllm > "$RUN_DIR/$tag/engine.log" 2>&1
  docker logs decide-service > "$RUN_DIR/$tag/service.log" 2>&1
  docker rm -f vllm decide-service >/dev/null 2>&1
}

upload() {
  if [ "$PLATFORM" = aws ]; then
    aws s3 cp --recursive --only-show-errors "$RUN_DIR" "$DEST"
  else
    docker run --rm --net=host -v "$RUN_DIR:/out:ro" "$SERVICE_IMAGE" eval upload /out "$DEST" \
      || gcloud storage rsync -r "$RUN_DIR" "$DEST"
  fi
}

# Runs on every exit, failed or not: what the run directory holds is uploaded, then the machine goes.
finish() {
  local status=$?
  trap - EXIT
  log "finished with status $status; uploading to $DEST, then: ${SELF_DELETE[*]}"
  if upload; then echo "uploaded $RUN_DIR to $DEST"; else echo "upload to $DEST failed"; fi
  "${SELF_DELETE[@]}"
}

log "start $RUN_NAME ($PLATFORM, $ACCELERATOR); the run directory goes to $DEST"
cp "$0" "$RUN_DIR/startup.sh"  # the run keeps the exact script (and so its settings) it ran
trap finish EXIT
if [ "$PLATFORM" = aws ]; then
  # EC2 has no run-duration limit: a scheduled shutdown is the backstop (the instance was created
  # with --instance-initiated-shutdown-behavior terminate, so shutting down deletes it).
  shutdown -h "+$(( MAX_RUN_SECONDS / 60 ))" >/dev/null 2>&1
  log "backstop: shutdown (terminate) in $(( MAX_RUN_SECONDS / 60 )) minutes"
else
  log "backstop: deleted by Google Cloud $MAX_RUN_SECONDS s after it started (max run duration)"
fi
ensure_docker || { log "FAILED: no docker"; exit 1; }
fetch_hf_token || { log "FAILED: secret $HF_SECRET unreadable"; exit 1; }
log "Hugging Face token read from secret $HF_SECRET"
registry_login
pull "$ENGINE_IMAGE" || { log "FAILED: could not pull $ENGINE_IMAGE"; exit 1; }
pull "$SERVICE_IMAGE" || { log "FAILED: could not pull $SERVICE_IMAGE"; exit 1; }
if [ -n "$EVAL_DATA" ]; then
  copy_in "$EVAL_DATA" "$DATA_DIR" || { log "FAILED: could not copy $EVAL_DATA"; exit 1; }
  log "copied $EVAL_DATA"
fi
if [ -n "$PATCHES" ]; then
  copy_in "$PATCHES" "$WHEELS_DIR" || { log "FAILED: could not copy the patches plugin $PATCHES"; exit 1; }
  log "copied the patches plugin from $PATCHES: $(ls "$WHEELS_DIR")"
fi
# One arm at a time: build, serve, measure, stop, upload (a later arm's failure keeps the earlier results).
for i in "${!MODELS[@]}"; do
  if prepare_model "$i" && serve_model "$i" && start_service "$i"; then
    if [ -n "$EVAL_RUN" ] && measures "$i" read; then run_eval "$i"; fi
    if measures "$i" load; then run_load "$i"; fi
    if { [ "${#GEN_TASKS[@]}" -gt 0 ] || [ -n "$GEN_THROUGHPUT" ]; } && measures "$i" generation; then run_generate "$i"; fi
  fi
  stop_model "$i"
  if [ -n "${MODEL_PREP[$i]}" ]; then rm -rf "${BUILDS_DIR:?}/${MODEL_TAGS[$i]}"; fi
  if [ "${#MODELS[@]}" -gt 1 ]; then upload || log "upload after ${MODEL_TAGS[$i]} failed"; fi
done
log "DONE"
