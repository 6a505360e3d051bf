/* The template's loop between two children, in C
 * (docs/decisions/102-template-loop-and-jail-in-c.md).
 *
 * Every page the template writes while its children share it is copied (copy-on-write):
 * the template's Python, run between two forks, wrote ~110 pages per call (measured), and
 * ran the interpreter for its bookkeeping. Here the template waits, forks, hands each child to the
 * host and reaps it with a few system calls and a C stack, touching a handful of pages.
 * Python runs only in a new child (this function returns there) and on the rare paths it is
 * given as callables: a scratch directory a child left files in, and the scratch of the
 * insecure mode without a mount namespace.
 *
 * What it does is what template.py's loop did (docs/security.md): a uid of its own and a
 * new scratch directory per child; the host gets a pidfd of the child and one end of a
 * socketpair over the control socket (SCM_RIGHTS); the template reaps each child, empties
 * its scratch and reports how it ended. The messages are the same bytes as before.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <grp.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

#ifndef SYS_close_range
#define SYS_close_range 436
#endif

#define MAX_UIDS 1024
#define MAX_LIMITS 16
#define MAX_FILTER 4096 /* BPF instructions: seccomp.py's cap */
#define MAX_SPAWN 64 /* children one spawn request may ask for */
#define DIRTY_RETRY_MS 1000 /* between two tries at emptying the scratch of dirty uids */
#define MAX_REQUEST 64 /* bytes of protocol.SPAWN and protocol.STOP, each */

typedef struct {
    pid_t pid;       /* the uid's live child, 0 if none */
    char dirty;      /* files a child left could not be removed: out of use until they are */
    unsigned long n; /* the child's scratch directory's number */
} Slot;

/* The template's state, written between forks: kept small and together, so that the pages
 * it writes (each copied while children share it) are few. */
typedef struct {
    int ctl;
    int uid_base;
    int uid_count;
    int javascript; /* fork with CPython's own work around it (a V8 worker starts threads) */
    int own_tmp;    /* a tmpfs per uid in the jail's own /tmp: /tmp/<uid>/s/<n> per child */
    int warm_nice;
    int drop;       /* to the child's uid: the template runs as root */
    char spawn_prefix[MAX_REQUEST]; /* the host's requests: protocol.SPAWN, protocol.STOP */
    char stop[MAX_REQUEST];
    size_t spawn_len, stop_len;
    PyObject *prepare; /* callable(uid, scratch): makes it, when not own_tmp */
    PyObject *empty;   /* callable(uid, scratch) -> whether files stay (the uid is dirty) */
    unsigned long made;
    long pending; /* children asked for while every uid was in use */
    int dirty_uids; /* uids out of use: their scratch could not be emptied */
    int64_t retried_at; /* when the last try at their scratch ended (now_ms) */
    sigset_t mask;   /* the template's signal mask before serve(): a child's */
    int free_head;
    int free_len;
    int nlimits;
    int limit_res[MAX_LIMITS];
    struct rlimit limit[MAX_LIMITS];
    struct sock_fprog prog; /* len 0: no filter (insecure mode) */
    int free_uids[MAX_UIDS]; /* a ring, oldest first */
    Slot slots[MAX_UIDS];
} State;

static State S;
static struct sock_filter filter_rules[MAX_FILTER]; /* read, never written, by children */
static int wake[2] = {-1, -1};
static int serving = 0;

static void on_child(int sig) {
    (void)sig;
    int saved = errno;
    char byte = 0;
    if (write(wake[1], &byte, 1) < 0) {
        /* full: a wake-up is pending anyway */
    }
    errno = saved;
}

static PyObject *os_error(const char *what) {
    PyErr_SetFromErrnoWithFilename(PyExc_OSError, what);
    return NULL;
}

static void path_of(int uid, unsigned long n, char *out, size_t size) {
    if (S.own_tmp) {
        snprintf(out, size, "/tmp/%d/s/%lu", uid, n); /* template.py: scratch_root */
    } else {
        snprintf(out, size, "/tmp/%d", uid);
    }
}

/* One report on the control socket (SOCK_SEQPACKET: a message is sent whole or not at all). */
static int send_report(const char *msg, int len) {
    for (;;) {
        ssize_t sent = send(S.ctl, msg, (size_t)len, 0);
        if (sent >= 0) return 0;
        if (errno != EINTR) return -1;
    }
}

/* Closes every descriptor from 3 up but ``keep``: close_range (Linux 5.9+), else one by
 * one up to the template's limit of open files. */
static void close_all_but(int keep) {
    int ok = (keep <= 3 || syscall(SYS_close_range, 3, keep - 1, 0) == 0) &&
             syscall(SYS_close_range, keep + 1, ~0U, 0) == 0;
    if (ok) return;
    if (errno != ENOSYS) _exit(70);
    struct rlimit files;
    long top = getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY
                   ? (long)files.rlim_cur
                   : 65536;
    for (long fd = 3; fd < top; fd++) {
        if (fd != keep) close((int)fd);
    }
}

/* A new child becomes a jailed, unprivileged process before any of its Python runs. Order
 * matters: the parent's death, descriptors, signals, its directory, limits, identity, then
 * no_new_privs and the seccomp filter last. Anything that fails ends the child (70): the
 * host sees a child that died before it was ready. */
static void become(int uid, const char *scratch, int keep) {
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0) _exit(70);
    /* Every descriptor but its channel: the control socket, the wake-up pipe, the rest. */
    close_all_but(keep);
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    if (sigaction(SIGCHLD, &dfl, NULL) != 0) _exit(70);
    /* The template's mask before serve() (it blocks every signal outside its wait). */
    if (sigprocmask(SIG_SETMASK, &S.mask, NULL) != 0) _exit(70);
    if (S.warm_nice && setpriority(PRIO_PROCESS, 0, S.warm_nice) != 0) _exit(70);
    if (chdir(scratch) != 0) _exit(70);
    for (int i = 0; i < S.nlimits; i++) {
        if (setrlimit(S.limit_res[i], &S.limit[i]) != 0) _exit(70);
    }
    if (S.drop) {
        if (setgroups(0, NULL) != 0) _exit(70);
        if (setresgid((gid_t)uid, (gid_t)uid, (gid_t)uid) != 0) _exit(70);
        if (setresuid((uid_t)uid, (uid_t)uid, (uid_t)uid) != 0) _exit(70);
        /* A change of the effective uid or gid clears the parent-death signal: again. */
        if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0) _exit(70);
    }
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) _exit(70);
    if (S.prog.len) {
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) _exit(70);
        if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &S.prog, 0, 0) != 0) _exit(70);
    }
}

static int64_t now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static void free_uid(int uid) {
    S.free_uids[(S.free_head + S.free_len) % S.uid_count] = uid;
    S.free_len++;
}

/* A uid whose scratch holds something it could not remove serves no call (retry_dirty). */
static void hold_dirty(Slot *it) {
    it->dirty = 1;
    if (S.dirty_uids++ == 0) S.retried_at = now_ms();
}

/* Makes one child. Returns Py_None (borrowed) in the template, a new (uid, scratch, fd)
 * tuple in the child, NULL with an exception set on an error. */
static PyObject *spawn(void) {
    if (S.free_len == 0) {
        S.pending++; /* at capacity: made when a child ends and frees its uid */
        return Py_None;
    }
    int uid = S.free_uids[S.free_head];
    S.free_head = (S.free_head + 1) % S.uid_count;
    S.free_len--;
    char scratch[256];
    /* Own /tmp: a directory never used before, in the uid's own tmpfs (emptied at each
     * reap): a descriptor an earlier process kept open names a directory that is gone. */
    unsigned long n = S.own_tmp ? ++S.made : 0;
    path_of(uid, n, scratch, sizeof scratch);
    if (S.own_tmp) {
        if (mkdir(scratch, 0700) != 0) return os_error(scratch);
        if (chown(scratch, (uid_t)uid, (gid_t)uid) != 0) return os_error(scratch);
    } else {
        PyObject *done = PyObject_CallFunction(S.prepare, "is", uid, scratch);
        if (done == NULL) {
            /* Insecure mode: something is in the way in the host's /tmp (what a walk left,
             * or a name another uid's tool made): that uid serves no call until it is
             * gone, and the child asked for is made with the next free uid. */
            if (!PyErr_ExceptionMatches(PyExc_OSError)) return NULL;
            PyErr_Clear();
            hold_dirty(&S.slots[uid - S.uid_base]);
            S.pending++;
            return Py_None;
        }
        Py_DECREF(done);
    }
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
        return os_error("socketpair");
    }
    pid_t pid;
    if (S.javascript) {
        PyOS_BeforeFork();
        pid = fork();
        if (pid == 0) {
            PyOS_AfterFork_Child();
        } else {
            PyOS_AfterFork_Parent();
        }
    } else {
        /* libc's fork without CPython's own work around it (os.fork's PyOS_BeforeFork and
         * PyOS_AfterFork_Child, with the after-fork hooks modules registered). That work
         * re-makes the state of other threads and of locks they might hold: threading's
         * hook alone touched ~110 pages of a new child, ~0.2 ms of CPU
         * (docs/decisions/101-fewer-pages-written-per-child.md). The template has one thread and
         * holds no lock here. The one hook a child needs is random's: it reseeds (template.py), or
         * every child would draw the same numbers. */
        pid = fork();
    }
    if (pid < 0) {
        int saved = errno;
        close(pair[0]);
        close(pair[1]);
        errno = saved;
        return os_error("fork");
    }
    if (pid == 0) {
        become(uid, scratch, pair[1]);
        PyObject *made = Py_BuildValue("(isi)", uid, scratch, pair[1]);
        if (made == NULL) _exit(70); /* no exception may leave serve() in a child */
        return made;
    }
    close(pair[1]);
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pidfd < 0) {
        int saved = errno;
        close(pair[0]);
        errno = saved;
        return os_error("pidfd_open");
    }
    char msg[96]; /* JSON, as the host reads it */
    int len = snprintf(msg, sizeof msg, "{\"op\": \"ready\", \"pid\": %d, \"uid\": %d}", (int)pid, uid);
    int fds[2] = {pidfd, pair[0]};
    union {
        char buf[CMSG_SPACE(sizeof fds)];
        struct cmsghdr align;
    } control;
    memset(&control, 0, sizeof control);
    struct iovec iov = {msg, (size_t)len};
    struct msghdr mh;
    memset(&mh, 0, sizeof mh);
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = control.buf;
    mh.msg_controllen = sizeof control.buf;
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof fds);
    memcpy(CMSG_DATA(cm), fds, sizeof fds);
    ssize_t sent;
    do {
        sent = sendmsg(S.ctl, &mh, 0);
    } while (sent < 0 && errno == EINTR);
    int saved = errno;
    close(pidfd);
    close(pair[0]);
    if (sent < 0) {
        errno = saved;
        return os_error("sendmsg");
    }
    S.slots[uid - S.uid_base].pid = pid;
    S.slots[uid - S.uid_base].n = n;
    return Py_None;
}

/* Python empties a scratch a child left files in: 1 if something stays, 0 if not, -1 with
 * an exception set. */
static int empty_scratch(int uid, const char *scratch) {
    PyObject *left = PyObject_CallFunction(S.empty, "is", uid, scratch);
    if (left == NULL) return -1;
    int stays = PyObject_IsTrue(left);
    Py_DECREF(left);
    return stays;
}

static PyObject *spawn_owed(void);

/* A uid whose scratch still holds what a child left serves no other call: its scratch is
 * emptied again every DIRTY_RETRY_MS, and the uid used again once it is empty. */
static PyObject *retry_dirty(void) {
    for (int i = 0; i < S.uid_count; i++) {
        Slot *it = &S.slots[i];
        if (!it->dirty) continue; /* a dirty uid has no child: it is never handed out */
        char scratch[256];
        path_of(S.uid_base + i, it->n, scratch, sizeof scratch);
        int left = empty_scratch(S.uid_base + i, scratch);
        if (left < 0) return NULL;
        if (!left) {
            it->dirty = 0;
            S.dirty_uids--;
            free_uid(S.uid_base + i);
        }
    }
    return spawn_owed();
}

/* Reaps every child that ended, then makes the children owed. Same returns as spawn(). */
static PyObject *reap(void) {
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid < 0) {
            if (errno == EINTR) continue;
            if (errno == ECHILD) break;
            return os_error("waitpid");
        }
        if (pid == 0) break;
        int slot = -1;
        for (int i = 0; i < S.uid_count; i++) {
            if (S.slots[i].pid == pid) {
                slot = i;
                break;
            }
        }
        if (slot < 0) continue;
        Slot *it = &S.slots[slot];
        it->pid = 0;
        int uid = S.uid_base + slot;
        char scratch[256];
        path_of(uid, it->n, scratch, sizeof scratch);
        /* Most tools leave no file: one rmdir. Else Python empties it (template.py). */
        int left = S.own_tmp && rmdir(scratch) == 0 ? 0 : empty_scratch(uid, scratch);
        if (left < 0) return NULL;
        if (left) {
            hold_dirty(it);
        } else {
            free_uid(uid);
        }
        char msg[96];
        int len;
        if (WIFSIGNALED(status)) {
            len = snprintf(msg, sizeof msg, "{\"op\": \"exit\", \"pid\": %d, \"signal\": %d}",
                           (int)pid, WTERMSIG(status));
        } else {
            len = snprintf(msg, sizeof msg, "{\"op\": \"exit\", \"pid\": %d, \"code\": %d}",
                           (int)pid, WEXITSTATUS(status));
        }
        if (send_report(msg, len) != 0) return os_error("send");
    }
    return spawn_owed();
}

/* Makes the children asked for while every uid was in use, as far as uids are free. */
static PyObject *spawn_owed(void) {
    while (S.pending && S.free_len) {
        S.pending--;
        PyObject *made = spawn();
        if (made != Py_None) return made;
    }
    return Py_None;
}

#define ASKED_STOP (-1)
#define ASKED_NOTHING (-2)

/* What the host asked for: children to make (0 or more, at most MAX_SPAWN), ASKED_STOP, or
 * ASKED_NOTHING for anything else (ignored). */
static long parse(const char *raw, ssize_t size) {
    size_t prefix = S.spawn_len;
    if ((size_t)size == S.stop_len && memcmp(raw, S.stop, S.stop_len) == 0) return ASKED_STOP;
    if (size < (ssize_t)prefix + 2 || memcmp(raw, S.spawn_prefix, prefix) != 0) {
        return ASKED_NOTHING;
    }
    if (raw[size - 1] != '}') return ASKED_NOTHING;
    long n = 0;
    for (ssize_t i = (ssize_t)prefix; i < size - 1; i++) {
        if (raw[i] < '0' || raw[i] > '9') return ASKED_NOTHING;
        if (n < MAX_SPAWN) n = n * 10 + (raw[i] - '0');
    }
    return n < MAX_SPAWN ? n : MAX_SPAWN;
}

static PyObject *serve(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *names[] = {"ctl",     "uid_base", "uid_count", "warm",  "javascript",
                            "own_tmp", "warm_nice", "limits",   "drop",  "seccomp",
                            "spawn",   "stop",      "prepare",  "empty", NULL};
    int ctl, uid_base, uid_count, warm, javascript, own_tmp, warm_nice, drop;
    PyObject *limits, *prepare, *empty;
    Py_buffer filter = {0};
    const char *spawn_prefix, *stop;
    Py_ssize_t spawn_len, stop_len;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iiiippiOpz*y#y#OO", names, &ctl,
                                     &uid_base, &uid_count, &warm, &javascript, &own_tmp,
                                     &warm_nice, &limits, &drop, &filter, &spawn_prefix,
                                     &spawn_len, &stop, &stop_len, &prepare, &empty)) {
        return NULL;
    }
    Py_ssize_t nfilter = filter.buf ? filter.len : 0;
    int bad_filter = nfilter % (Py_ssize_t)sizeof(struct sock_filter) != 0 ||
                     nfilter > (Py_ssize_t)sizeof filter_rules;
    const char *wrong = NULL;
    if (bad_filter) {
        wrong = "seccomp: not a BPF program of at most 4096 rules";
    } else if (spawn_len >= MAX_REQUEST || stop_len >= MAX_REQUEST) {
        wrong = "spawn and stop are the host's requests: a few bytes each";
    } else if (serving) {
        wrong = "serve() runs once per process";
    } else if (uid_count < 1 || uid_count > MAX_UIDS) {
        wrong = "uid_count out of range";
    } else if (!PyCallable_Check(empty) || (!own_tmp && !PyCallable_Check(prepare))) {
        wrong = "empty (and prepare, without own_tmp) must be callable";
    }
    if (wrong != NULL) {
        PyBuffer_Release(&filter);
        PyErr_SetString(PyExc_ValueError, wrong);
        return NULL;
    }
    PyObject *seq = PySequence_Fast(limits, "limits must be a sequence");
    if (seq == NULL || PySequence_Fast_GET_SIZE(seq) > MAX_LIMITS) {
        Py_XDECREF(seq);
        PyBuffer_Release(&filter);
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "too many limits");
        return NULL;
    }
    memset(&S, 0, sizeof S);
    S.nlimits = (int)PySequence_Fast_GET_SIZE(seq);
    for (int i = 0; i < S.nlimits; i++) {
        long long res, soft, hard;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "LLL", &res, &soft, &hard)) {
            Py_DECREF(seq);
            PyBuffer_Release(&filter);
            return NULL;
        }
        S.limit_res[i] = (int)res;
        S.limit[i].rlim_cur = (rlim_t)soft;
        S.limit[i].rlim_max = (rlim_t)hard;
    }
    Py_DECREF(seq);
    if (nfilter) memcpy(filter_rules, filter.buf, (size_t)nfilter);
    S.prog.len = (unsigned short)(nfilter / (Py_ssize_t)sizeof(struct sock_filter));
    S.prog.filter = filter_rules;
    PyBuffer_Release(&filter);
    S.drop = drop;
    memcpy(S.spawn_prefix, spawn_prefix, (size_t)spawn_len);
    S.spawn_len = (size_t)spawn_len;
    memcpy(S.stop, stop, (size_t)stop_len);
    S.stop_len = (size_t)stop_len;
    serving = 1;
    S.ctl = ctl;
    S.uid_base = uid_base;
    S.uid_count = uid_count;
    S.javascript = javascript;
    S.own_tmp = own_tmp;
    S.warm_nice = warm_nice;
    Py_INCREF(prepare);
    Py_INCREF(empty);
    S.prepare = prepare;
    S.empty = empty;
    for (int i = 0; i < uid_count; i++) S.free_uids[i] = uid_base + i;
    S.free_len = uid_count;
    if (pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) return os_error("pipe2");
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_child;
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGCHLD, &sa, NULL) != 0) return os_error("sigaction");
    /* Signals are delivered only while the loop waits (ppoll below), so that one never
     * arrives between a check and the wait; a child gets the template's mask back. */
    sigset_t all;
    sigfillset(&all);
    if (sigprocmask(SIG_BLOCK, &all, &S.mask) != 0) return os_error("sigprocmask");
    for (int i = 0; i < warm; i++) {
        PyObject *made = spawn();
        if (made != Py_None) return made;
    }
    char raw[4096];
    for (;;) {
        struct pollfd fds[2] = {{S.ctl, POLLIN, 0}, {wake[0], POLLIN, 0}};
        int timeout = -1;
        if (S.dirty_uids) {
            int64_t since = now_ms() - S.retried_at;
            if (since >= DIRTY_RETRY_MS) {
                PyObject *made = retry_dirty();
                if (made != Py_None) return made;
                /* From its end: a slow try (a big tree to walk) never runs back to back
                 * with the next, so the loop serves the host between two. */
                S.retried_at = now_ms();
                since = 0;
            }
            timeout = S.dirty_uids ? (int)(DIRTY_RETRY_MS - since) : -1;
        }
        struct timespec wait = {timeout / 1000, (long)(timeout % 1000) * 1000000L};
        int ready = ppoll(fds, 2, timeout < 0 ? NULL : &wait, &S.mask);
        if (ready == 0) continue; /* time to try the dirty uids again */
        if (ready < 0 && errno != EINTR) return os_error("ppoll");
        /* A signal with a Python handler (template.py leaves none but the defaults): its
         * handler runs here, never left pending for a child forked after it to run. */
        if (PyErr_CheckSignals() < 0) return NULL;
        if (ready < 0) continue;
        if (fds[1].revents) {
            while (read(wake[0], raw, sizeof raw) > 0) {
            }
            PyObject *made = reap();
            if (made != Py_None) return made;
        }
        if (fds[0].revents) {
            ssize_t size = recv(S.ctl, raw, sizeof raw, 0);
            if (size < 0) {
                if (errno == EINTR || errno == EAGAIN) continue;
                return os_error("recv");
            }
            if (size == 0) Py_RETURN_NONE; /* the host has gone: PID 1 exits, the rest die */
            long asked = parse(raw, size);
            if (asked == ASKED_STOP) Py_RETURN_NONE;
            for (long i = 0; i < asked; i++) {
                PyObject *made = spawn();
                if (made != Py_None) return made;
            }
            PyObject *made = reap();
            if (made != Py_None) return made;
        }
    }
}

static PyMethodDef methods[] = {
    {"serve", (PyCFunction)(void (*)(void))serve, METH_VARARGS | METH_KEYWORDS,
     "serve(ctl, uid_base, uid_count, warm, javascript, own_tmp, warm_nice, limits, drop,\n"
     "      seccomp, spawn, stop, prepare, empty)\n"
     "Make and reap children until the host stops it (None), or, in a new child that has\n"
     "become what child.py says (limits, uid, seccomp), return (uid, scratch, fd): its uid,\n"
     "scratch directory and end of its socketpair."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_spawn", "The template's loop between two children.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__spawn(void) { return PyModule_Create(&module); }
