/* The template's loop between two children, in C (docs/benchmarks.md, step 45).
 *
 * Every page the template writes while its children share it is copied (copy-on-write):
 * the template's Python, run between two forks, wrote ~130 pages per child, and ran the
 * interpreter for its bookkeeping. Here the template waits, forks, hands each child to the
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
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

#define MAX_UIDS 4096
#define MAX_SPAWN 64 /* children one spawn request may ask for */
#define SPAWN_PREFIX "{\"op\": \"spawn\", \"n\": "
#define STOP "{\"op\": \"stop\"}"

typedef struct {
    int ctl;
    int uid_base;
    int uid_count;
    int javascript; /* fork with CPython's own work around it (a V8 worker starts threads) */
    int own_tmp;    /* a tmpfs per uid in the jail's own /tmp: /tmp/<uid>/<n> per child */
    int warm_nice;
    PyObject *prepare; /* callable(uid) -> scratch path, when not own_tmp */
    PyObject *empty;   /* callable(uid, scratch) -> whether files stay (the uid is dirty) */
    pid_t live[MAX_UIDS];           /* the child of each uid, 0 if none */
    unsigned long scratch[MAX_UIDS]; /* its scratch directory's number */
    char dirty[MAX_UIDS];
    int free_uids[MAX_UIDS]; /* a ring, oldest first */
    int free_head;
    int free_len;
    unsigned long made;
    long pending; /* children asked for while every uid was in use */
} State;

static State S;
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
        snprintf(out, size, "/tmp/%d/%lu", uid, n);
    } else {
        snprintf(out, size, "/tmp/%d", uid);
    }
}

static int send_all(const char *msg, int len) {
    for (;;) {
        ssize_t sent = send(S.ctl, msg, (size_t)len, 0);
        if (sent >= 0) return 0;
        if (errno != EINTR) return -1;
    }
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
    unsigned long n = 0;
    if (S.own_tmp) {
        /* A directory never used before, in the uid's own tmpfs (emptied at each reap): a
         * descriptor an earlier process kept open names a directory that is gone. */
        n = ++S.made;
        path_of(uid, n, scratch, sizeof scratch);
        if (mkdir(scratch, 0700) != 0) return os_error(scratch);
        if (chown(scratch, (uid_t)uid, (gid_t)uid) != 0) return os_error(scratch);
    } else {
        PyObject *made = PyObject_CallFunction(S.prepare, "i", uid);
        if (made == NULL) return NULL;
        const char *text = PyUnicode_AsUTF8(made);
        if (text == NULL || strlen(text) >= sizeof scratch) {
            Py_DECREF(made);
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "scratch path too long");
            return NULL;
        }
        strcpy(scratch, text);
        Py_DECREF(made);
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
        /* libc's fork without CPython's work around it (linux.fork says why): the template
         * has one thread and holds no lock here. */
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
        close(pair[0]);
        close(wake[0]);
        close(wake[1]);
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        sigaction(SIGCHLD, &dfl, NULL);
        if (S.warm_nice && setpriority(PRIO_PROCESS, 0, S.warm_nice) != 0) _exit(70);
        return Py_BuildValue("(isi)", uid, scratch, pair[1]);
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
    S.live[uid - S.uid_base] = pid;
    S.scratch[uid - S.uid_base] = n;
    return Py_None;
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
            if (S.live[i] == pid) {
                slot = i;
                break;
            }
        }
        if (slot < 0) continue;
        S.live[slot] = 0;
        int uid = S.uid_base + slot;
        char scratch[256];
        path_of(uid, S.scratch[slot], scratch, sizeof scratch);
        /* Most tools leave no file: one rmdir. Else Python empties it (template.py). */
        if (!S.own_tmp || S.dirty[slot] || rmdir(scratch) != 0) {
            PyObject *left = PyObject_CallFunction(S.empty, "is", uid, scratch);
            if (left == NULL) return NULL;
            S.dirty[slot] = (char)PyObject_IsTrue(left);
            Py_DECREF(left);
        }
        S.free_uids[(S.free_head + S.free_len) % S.uid_count] = uid;
        S.free_len++;
        char msg[96];
        int len;
        if (WIFSIGNALED(status)) {
            len = snprintf(msg, sizeof msg, "{\"op\": \"exit\", \"pid\": %d, \"signal\": %d}",
                           (int)pid, WTERMSIG(status));
        } else {
            len = snprintf(msg, sizeof msg, "{\"op\": \"exit\", \"pid\": %d, \"code\": %d}",
                           (int)pid, WEXITSTATUS(status));
        }
        if (send_all(msg, len) != 0) return os_error("send");
    }
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
    size_t prefix = sizeof SPAWN_PREFIX - 1;
    if (size == (ssize_t)(sizeof STOP - 1) && memcmp(raw, STOP, (size_t)size) == 0) {
        return ASKED_STOP;
    }
    if (size < (ssize_t)prefix + 2 || memcmp(raw, SPAWN_PREFIX, prefix) != 0) return ASKED_NOTHING;
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
    static char *names[] = {"ctl", "uid_base", "uid_count", "warm", "javascript", "own_tmp",
                            "warm_nice", "prepare", "empty", NULL};
    int ctl, uid_base, uid_count, warm, javascript, own_tmp, warm_nice;
    PyObject *prepare, *empty;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iiiippiOO", names, &ctl, &uid_base,
                                     &uid_count, &warm, &javascript, &own_tmp, &warm_nice,
                                     &prepare, &empty)) {
        return NULL;
    }
    if (serving) {
        PyErr_SetString(PyExc_RuntimeError, "serve() runs once per process");
        return NULL;
    }
    if (uid_count < 1 || uid_count > MAX_UIDS) {
        PyErr_SetString(PyExc_ValueError, "uid_count out of range");
        return NULL;
    }
    if (!PyCallable_Check(empty) || (!own_tmp && !PyCallable_Check(prepare))) {
        PyErr_SetString(PyExc_TypeError, "empty (and prepare, without own_tmp) must be callable");
        return NULL;
    }
    serving = 1;
    memset(&S, 0, sizeof S);
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
    for (int i = 0; i < warm; i++) {
        PyObject *made = spawn();
        if (made != Py_None) return made;
    }
    char raw[4096];
    for (;;) {
        struct pollfd fds[2] = {{S.ctl, POLLIN, 0}, {wake[0], POLLIN, 0}};
        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR) continue;
            return os_error("poll");
        }
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
     "serve(ctl, uid_base, uid_count, warm, javascript, own_tmp, warm_nice, prepare, empty)\n"
     "Make and reap children until the host stops it (None), or, in a new child, return\n"
     "(uid, scratch, fd): its uid, scratch directory and end of its socketpair."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_spawn", "The template's loop between two children.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__spawn(void) { return PyModule_Create(&module); }
