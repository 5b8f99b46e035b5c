"""pydvm's PSI/J executor (``psij.JobExecutor.get_instance("pydvm")``).

Needs psij-python (``pip install 'pydvm[psij]'``).  :mod:`.spec` maps a
PSI/J job onto a DVM job (pure), :mod:`.executor` runs it through the job
API, :mod:`.plugin` is what PSI/J's descriptor names.  Nothing is imported
here: ``import pydvm.psij`` loads neither psij nor the job API.
"""
