"""Executors for tests of the core: a whole job whose request is a function, run on the worker."""

from webapp.core.executors import WholeJobs


class FunctionJobs(WholeJobs):
    """A whole-job executor for tests: the job's request is `fn(job, core)`."""

    def run(self, job, core):
        job.request(job, core)
