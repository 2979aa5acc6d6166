from opendecide.cli import app

app(prog_name="decide")
