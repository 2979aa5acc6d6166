#!/usr/bin/env bash
# One stand-in for docker, curl, gcloud, aws, shutdown and apt-get (named by the link it is called
# through): it records its argv in $FAKE_CALLS and answers as the real tool would on a healthy machine.
# FAKE_ENGINE_DIES=1 makes the engine container exit before it serves.
set -u
tool=$(basename "$0")
printf '%s\0' "$tool" "$@" >> "$FAKE_CALLS"
printf '\n' >> "$FAKE_CALLS"
case $tool in
  docker)
    case $1 in
      inspect) echo "${!#}" ;;
      ps) if [ "${FAKE_ENGINE_DIES:-0}" = 1 ] && [ "$4" = 'name=^vllm$' ]; then :; else echo 0123456789ab; fi ;;
      logs) echo "INFO fake log of $2"; [ "${FAKE_ENGINE_DIES:-0}" = 1 ] && echo "RuntimeError: fake engine died" ;;
      info) echo "Runtimes: nvidia runc" ;;
    esac ;;
  curl)
    url=${!#}
    case $url in
      */project/project-id) echo placeholder-project ;;
      */service-accounts/default/token) echo '{"access_token": "fake-access-token"}' ;;
      https://secretmanager.googleapis.com/*)
        echo "{\"payload\": {\"data\": \"$(printf '%s' "$FAKE_HF_TOKEN" | base64)\"}}" ;;
      */v1/models)
        if [[ " $* " == *" -w "* ]]; then echo 200;
        elif [ "${FAKE_ENGINE_DIES:-0}" = 1 ]; then exit 7;
        else echo '{"data": [{"id": "served"}]}'; fi ;;
    esac ;;
  aws)
    if [ "$1" = secretsmanager ]; then echo "$FAKE_HF_TOKEN"; fi ;;
esac
exit 0
