"""The apps of test_parsl_executor.py, in a module of their own: an app's
job imports the module of its function by name, and this one needs
nothing but Parsl."""

from parsl.app.app import bash_app, python_app


@python_app
def square(x):
    return x * x


@python_app
def divide(a, b):
    return a / b


@python_app
def parsl_version():
    import parsl  # the whole package, loaded on first use of one of its names

    return parsl.__version__


@bash_app
def where(stdout=None):
    return 'echo "$PYDVM_NODE"'


@bash_app
def shell(command, stdout=None, stderr=None, walltime=None, outputs=(),
          parsl_resource_specification={}):
    return command


def runner_context():
    """Whether the process has imported pydvm, and its sys.path[0]."""
    import sys

    return "pydvm" in sys.modules, sys.path[0]


def chatty():
    """Prints on both streams, returns 1."""
    import sys

    print("to stdout")
    print("to stderr", file=sys.stderr)
    return 1


@python_app
def dies(code):
    import os
    import sys

    print("going down", file=sys.stderr, flush=True)
    os._exit(code)
