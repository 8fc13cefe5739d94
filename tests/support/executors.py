"""Executors for tests of the core: a whole job whose request is a function, run on the worker."""


class FunctionJobs:
    """A whole-job executor for tests: the job's request is `fn(job, core)`."""

    batched = False

    def run(self, job, core):
        job.request(job, core)
