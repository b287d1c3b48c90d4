# Sourced by the install scripts that take one optional VENV argument: `venv_arg NAME HELP_LINES "$@"` parses
# [-h|--help] [VENV] and sets `venv` (default $VIRTUAL_ENV, else ./.venv) and `py` (its python), or exits 2 naming
# what was wrong. NAME is the script's name for messages; HELP_LINES the `sed -n` range of its usage comment.
venv_arg() {
    local name="$1" help="$2" script="$0" arg
    shift 2
    venv=""
    for arg in "$@"; do
        case "$arg" in
            -h|--help) sed -n "${help}p" "$script"; exit 0 ;;
            -*) echo "$name: unknown option '$arg'; valid: [VENV]" >&2; exit 2 ;;
            *) if [ -n "$venv" ]; then echo "$name: got two venvs ('$venv', '$arg'); pass one" >&2; exit 2; fi
               venv="$arg" ;;
        esac
    done
    venv="${venv:-${VIRTUAL_ENV:-.venv}}"
    py="$venv/bin/python"
    if [ ! -x "$py" ]; then
        echo "$name: no python at '$py'; pass the venv that holds TensorFlow, e.g. 'bash scripts/$name.sh .venv'" >&2
        exit 2
    fi
}
