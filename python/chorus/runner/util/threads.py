"""Thread helpers (Horovod's horovod.runner.util.threads)."""
import threading


def in_thread(target, args=(), name=None, daemon=True, silent=False):
    """Runs target(*args) in a new thread and returns the thread. silent: an
    exception in target ends the thread without a traceback."""
    def run():
        try:
            target(*args)
        except BaseException:
            if not silent:
                raise
    thread = threading.Thread(target=run if silent else target, args=() if silent else args, name=name,
                              daemon=daemon)
    thread.start()
    return thread


def on_event(event, func, args=(), stop=None, check_stop_interval_s=1.0, silent=False):
    """Runs func(*args) in a thread once event is set, unless stop is set first."""
    def wait_then_run():
        while not event.wait(check_stop_interval_s):
            if stop is not None and stop.is_set():
                return
        func(*args)
    return in_thread(wait_then_run, silent=silent)
