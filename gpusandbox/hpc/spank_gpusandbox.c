/*
 * spank_gpusandbox: pyxis's srun/sbatch options (--container-image, ...) over
 * gpusandbox.  Built and installed by `gpusandbox slurm install-plugin`
 * (gpusandbox/hpc/spank.py), which prints the plugstack.conf line:
 *
 *     required /path/spank_gpusandbox.so task=/path/gpusandbox-spank-task
 *
 * The plugin only parses and checks; it builds no sandbox.  In the task child
 * (slurm_spank_task_init: as the job's user, just before slurmstepd's own
 * execve) it replaces the task's argv[0] with the `task=` program and hands it
 * the options and the original argv[0] in GPUSANDBOX_SPANK_* variables of the
 * task environment.  slurmstepd then runs its TaskProlog, sets the user's
 * limits and execs that program as the task itself: the pid slurmstepd waits
 * for, in the step's cgroups, with the task's stdio, signals, PMI descriptors
 * and environment.  The program (gpusandbox.hpc.spanktask) turns the options
 * into `gpusandbox run OPTIONS IMAGE -- ARGV` in the same process.  Before
 * the tasks, slurm_spank_user_init runs it once per node in its check mode
 * (resolve the image, pull it on a miss), so a missing image fails the step
 * in one line before any task starts.  With --container-save, once the node's
 * last task has ended, slurm_spank_task_exit runs it again (save mode), as the
 * job's user, to write the squashfs file.
 *
 * Why argv[0] and not an execve of our own here: slurmstepd still has work to
 * do after task_init (TaskProlog, TMPDIR, PropagateResourceLimits), and only
 * argv[0] can be replaced: S_JOB_ARGV gives the array, not room to grow it.
 *
 * Options are checked where they are parsed, so srun, salloc and sbatch refuse
 * a bad one on the login node before any allocation.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <grp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <slurm/slurm.h>
#include <slurm/spank.h>

SPANK_PLUGIN(gpusandbox, 1);

enum opt_id {
	O_IMAGE, O_MOUNTS, O_WORKDIR, O_ENV, O_UNSHARE, O_NAME, O_SAVE, O_MOUNT_HOME,
	O_REMAP_ROOT, O_ENTRYPOINT, O_ENTRYPOINT_LOG, O_WRITABLE, O_COUNT
};

/* The variable each option reaches the task program in. */
static const char *const opt_env[O_COUNT] = {
	"GPUSANDBOX_SPANK_IMAGE", "GPUSANDBOX_SPANK_MOUNTS",
	"GPUSANDBOX_SPANK_WORKDIR", "GPUSANDBOX_SPANK_ENV",
	"GPUSANDBOX_SPANK_UNSHARE", "GPUSANDBOX_SPANK_NAME", "GPUSANDBOX_SPANK_SAVE",
	"GPUSANDBOX_SPANK_MOUNT_HOME",
	"GPUSANDBOX_SPANK_REMAP_ROOT", "GPUSANDBOX_SPANK_ENTRYPOINT",
	"GPUSANDBOX_SPANK_ENTRYPOINT_LOG", "GPUSANDBOX_SPANK_WRITABLE",
};

#define PREFIX "GPUSANDBOX_SPANK_"

static char *opt_val[O_COUNT];
/* The image check of user_init: its exit status (0: ready) for task_init. */
static int prepare_status;
/* Whether that check ran and passed (--container-save is written only then),
 * and how many of the node's tasks have ended since (slurmstepd's own count:
 * task_exit runs in slurmstepd itself, once per task). */
static int prepared;
static uint32_t tasks_ended;
static char *task_prog;
static int execute_entrypoint;

/* val: option id * 4 + form (0: takes ARG, 1: flag on, 2: flag off). */
#define V(id, form) ((id) * 4 + (form))

static int opt_cb(int val, const char *optarg, int remote);

static struct spank_option options[] = {
	{"container-image", "[USER@][REGISTRY#]IMAGE[:TAG]|PATH",
	 "[gpusandbox] the image to run the task in: an enroot URI, any gpusandbox "
	 "reference, or a squashfs file", 1, V(O_IMAGE, 0), opt_cb},
	{"container-mounts", "SRC[:DST[:FLAGS]][,...]",
	 "[gpusandbox] bind mounts; FLAGS joined with '+': ro, rw, rbind, rslave, "
	 "nosuid, nodev; SRC 'tmpfs' for a tmpfs at DST", 1, V(O_MOUNTS, 0), opt_cb},
	{"container-workdir", "PATH",
	 "[gpusandbox] working directory inside the container", 1, V(O_WORKDIR, 0), opt_cb},
	{"container-env", "NAME[,NAME...]",
	 "[gpusandbox] variables whose job value wins over the image's", 1,
	 V(O_ENV, 0), opt_cb},
	{"container-unshare", "net,ipc,uts",
	 "[gpusandbox] namespaces not shared with the node", 1, V(O_UNSHARE, 0), opt_cb},
	{"container-name", "NAME[:FLAG]",
	 "[gpusandbox] keep the container's writable state under NAME after the step "
	 "and reuse it (then --container-image may be left out); FLAG: auto (default), "
	 "create, exec, no_exec", 1, V(O_NAME, 0), opt_cb},
	{"container-save", "PATH",
	 "[gpusandbox] write the container's final state to PATH (a squashfs file, "
	 ".sqsh or .squashfs) once the node's tasks have ended", 1, V(O_SAVE, 0), opt_cb},
	{"container-mount-home", NULL,
	 "[gpusandbox] bind mount the user's home directory", 0, V(O_MOUNT_HOME, 1), opt_cb},
	{"no-container-mount-home", NULL,
	 "[gpusandbox] do not bind mount the user's home directory (default)", 0,
	 V(O_MOUNT_HOME, 2), opt_cb},
	{"container-remap-root", NULL,
	 "[gpusandbox] be root (uid 0) inside the container", 0, V(O_REMAP_ROOT, 1), opt_cb},
	{"no-container-remap-root", NULL,
	 "[gpusandbox] keep the user's uid inside (default)", 0, V(O_REMAP_ROOT, 2), opt_cb},
	{"container-entrypoint", NULL,
	 "[gpusandbox] run the image's entrypoint before the command", 0,
	 V(O_ENTRYPOINT, 1), opt_cb},
	{"no-container-entrypoint", NULL,
	 "[gpusandbox] do not run the image's entrypoint", 0, V(O_ENTRYPOINT, 2), opt_cb},
	{"container-entrypoint-log", NULL,
	 "[gpusandbox] show the entrypoint's output (gpusandbox always does)", 0,
	 V(O_ENTRYPOINT_LOG, 1), opt_cb},
	{"container-writable", NULL,
	 "[gpusandbox] a writable container filesystem, discarded at the end", 0,
	 V(O_WRITABLE, 1), opt_cb},
	{"container-readonly", NULL,
	 "[gpusandbox] a read-only container filesystem (default)", 0,
	 V(O_WRITABLE, 2), opt_cb},
	SPANK_OPTIONS_TABLE_END
};

static const char *const mount_flags[] = {
	"ro", "rw", "rbind", "rslave", "nosuid", "nodev", NULL
};
static const char *const unshare_names[] = {"net", "ipc", "uts", NULL};
static const char *const name_flags[] = {"auto", "create", "exec", "no_exec", NULL};

static int in_list(const char *s, size_t n, const char *const *list)
{
	for (; *list; list++)
		if (strlen(*list) == n && strncmp(*list, s, n) == 0)
			return 1;
	return 0;
}

static int printable(const char *s)
{
	for (; *s; s++)
		if (iscntrl((unsigned char) *s))
			return 0;
	return 1;
}

/* One SRC[:DST[:FLAGS]] of --container-mounts; NULL if good, else why not. */
static const char *check_mount(const char *m, size_t n)
{
	const char *c1 = memchr(m, ':', n), *c2, *f, *end = m + n;

	if (n == 0)
		return "an empty entry";
	if (c1 == m)
		return "an entry without SRC";
	if (!c1)
		return NULL;
	c2 = memchr(c1 + 1, ':', end - c1 - 1);
	if (c1 + 1 == end || c1[1] != '/')
		return "DST must be an absolute path";
	if (!c2)
		return NULL;
	if (memchr(c2 + 1, ':', end - c2 - 1))
		return "more than SRC:DST:FLAGS";
	for (f = c2 + 1; f <= end;) {
		const char *plus = memchr(f, '+', end - f);
		size_t len = (plus ? plus : end) - f;

		if (!in_list(f, len, mount_flags))
			return "unknown flag (ro, rw, rbind, rslave, nosuid, nodev; "
			       "join them with '+')";
		if (!plus)
			break;
		f = plus + 1;
	}
	return NULL;
}

/* A comma list whose items each pass item(); NULL if good, else why not. */
static const char *check_list(const char *s, const char *(*item)(const char *, size_t))
{
	const char *why;

	for (;;) {
		const char *comma = strchr(s, ',');
		size_t n = comma ? (size_t) (comma - s) : strlen(s);

		if ((why = item(s, n)))
			return why;
		if (!comma)
			return NULL;
		s = comma + 1;
	}
}

static const char *check_name(const char *s, size_t n)
{
	size_t i;

	if (n == 0 || isdigit((unsigned char) s[0]))
		return "not a variable name";
	for (i = 0; i < n; i++)
		if (!(isalnum((unsigned char) s[i]) || s[i] == '_'))
			return "not a variable name";
	return NULL;
}

static const char *check_unshare(const char *s, size_t n)
{
	return in_list(s, n, unshare_names) ? NULL : "unknown namespace (net, ipc, uts)";
}

static int ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), m = strlen(suffix);

	return n >= m && strcmp(s + n - m, suffix) == 0;
}

static const char *check(int id, const char *arg)
{
	size_t n;
	const char *colon;

	if (!arg || !*arg)
		return "a value is required";
	if (!printable(arg) || strlen(arg) > 8192)
		return "control characters or too long";
	switch (id) {
	case O_MOUNTS:
		return check_list(arg, check_mount);
	case O_WORKDIR:
		return arg[0] == '/' ? NULL : "must be an absolute path";
	case O_ENV:
		return check_list(arg, check_name);
	case O_UNSHARE:
		return check_list(arg, check_unshare);
	case O_NAME:
		colon = strchr(arg, ':');
		if (colon && colon[1] && !in_list(colon + 1, strlen(colon + 1), name_flags))
			return "FLAG after ':' must be auto, create, exec or no_exec";
		for (n = 0; arg + n != colon && arg[n]; n++)
			if (!(isalnum((unsigned char) arg[n]) || strchr("._-", arg[n])))
				return "letters, digits, '.', '_' and '-' only";
		return n == 0 || arg[0] == '.' || n > 64 ?
		       "a NAME of at most 64 characters, not starting with '.'" : NULL;
	case O_SAVE:
		if (arg[strlen(arg) - 1] == '/')
			return "the target is a directory";
		return ends_with(arg, ".sqsh") || ends_with(arg, ".squashfs") ? NULL :
		       "the file name must end in .sqsh or .squashfs (what "
		       "--container-image=PATH runs)";
	case O_IMAGE:
		if (arg[strlen(arg) - 1] == '/' && arg[0] != '/' && arg[0] != '.')
			return "an image reference cannot end in '/'";
		return NULL;
	}
	return NULL;
}

static int opt_cb(int val, const char *optarg, int remote)
{
	int id = val / 4, form = val % 4;
	const char *why, *value = form == 1 ? "1" : form == 2 ? "0" : optarg;

	if (id < 0 || id >= O_COUNT)
		return -1;
	if (form == 0 && (why = check(id, optarg))) {
		/* ids with an ARG come first in options[] */
		slurm_error("gpusandbox: --%s=%.200s: %s", options[id].name,
			    optarg ? optarg : "", why);
		/*
		 * In srun, salloc and sbatch (parsing options, before any
		 * allocation) end here as they do for a bad value of their own
		 * (--ntasks=x: one line, status 1); a failing callback would
		 * add Slurm's second "Invalid --X argument" line.
		 */
		if (!remote)
			exit(1);
		return -1;
	}
	free(opt_val[id]);
	opt_val[id] = strdup(value);
	return opt_val[id] ? 0 : -1;
}

static int parse_args(int ac, char **av)
{
	int i;

	for (i = 0; i < ac; i++) {
		if (strncmp(av[i], "task=", 5) == 0 && av[i][5] == '/') {
			free(task_prog);
			task_prog = strdup(av[i] + 5);
		} else if (strcmp(av[i], "execute_entrypoint=1") == 0) {
			execute_entrypoint = 1;
		} else if (strcmp(av[i], "execute_entrypoint=0") == 0) {
			execute_entrypoint = 0;
		} else {
			slurm_error("gpusandbox: plugstack.conf: unknown argument '%s' "
				    "(task=/ABSOLUTE/PATH, execute_entrypoint=0|1)", av[i]);
			return -1;
		}
	}
	return 0;
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	struct spank_option *o;
	spank_context_t ctx = spank_context();

	if (parse_args(ac, av))
		return -1;
	if (ctx != S_CTX_LOCAL && ctx != S_CTX_REMOTE && ctx != S_CTX_ALLOCATOR)
		return 0;
	for (o = options; o->name; o++)
		if (spank_option_register(sp, o) != ESPANK_SUCCESS) {
			slurm_error("gpusandbox: cannot register --%s", o->name);
			return -1;
		}
	return 0;
}

/* The child of run_check: the job's user entirely (slurmstepd keeps a real uid
 * of 0 in user_init, and is root in task_exit: then the job's supplementary
 * groups are set too), the signals, mask and OOM score of an ordinary process,
 * output into the pipe, then the task program in one of its check modes. */
static void check_child(int wfd, char **envp, uid_t uid, gid_t gid, gid_t *gids, int ngids)
{
	sigset_t none;
	int sig, fd;
	char *argv[] = {task_prog, NULL};

	for (sig = 1; sig < NSIG; sig++)
		signal(sig, SIG_DFL);
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	if ((fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC)) >= 0) {
		if (write(fd, "0", 1) < 0) {
			/* keep slurmstepd's score: not fatal */
		}
		close(fd);
	}
	if ((fd = open("/dev/null", O_RDONLY)) < 0 || dup2(fd, 0) < 0 ||
	    dup2(wfd, 1) < 0 || dup2(wfd, 2) < 0)
		_exit(125);
	closefrom(3);
	if (geteuid() == 0 && setgroups(ngids > 0 ? ngids : 0, gids))
		_exit(125);
	if (setresgid(gid, gid, gid) || setresuid(uid, uid, uid))
		_exit(125);
	execve(task_prog, argv, envp);
	_exit(127);
}

/* The error line of the check's output (the first `gpusandbox: error:` line,
 * else the last line), into out. */
static void error_line(const char *buf, char *out, size_t n)
{
	const char *p = strstr(buf, "gpusandbox: error:"), *e;

	if (!p) {
		p = buf + strlen(buf);
		while (p > buf && p[-1] == '\n')
			p--;
		while (p > buf && p[-1] != '\n')
			p--;
	}
	e = strchr(p, '\n');
	snprintf(out, n, "%.*s", (int) (e ? (size_t) (e - p) : strlen(p)), p);
}

/*
 * Run the task program as the job's user in a check mode (mode: "1", the
 * image check before the tasks; "save", --container-save after them) with the
 * job's environment and this step's options; its exit status, and its error
 * line (cleaned of control characters) logged with slurm_error.
 */
static int run_check(spank_t sp, const char *mode)
{
	char **env = NULL, **envp, buf[8192], line[1024];
	size_t n = 0, len = 0;
	ssize_t got;
	uid_t uid;
	gid_t gid, *gids = NULL;
	int pfd[2], status, i, ngids = 0, nvars = 0;
	pid_t pid;

	if (spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_GID, &gid) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_ENV, &env) != ESPANK_SUCCESS || !env ||
	    (geteuid() == 0 &&
	     spank_get_item(sp, S_JOB_SUPPLEMENTARY_GIDS, &gids, &ngids) != ESPANK_SUCCESS)) {
		slurm_error("gpusandbox: cannot read the job's user and environment");
		return 125;
	}
	for (i = 0; env[i]; i++)
		;
	if (!(envp = calloc(i + 5, sizeof(*envp))))
		return 125;
	for (i = 0; env[i]; i++)        /* the job's, without any of ours */
		if (strncmp(env[i], PREFIX, strlen(PREFIX)) != 0)
			envp[n++] = env[i];
	if (asprintf(&envp[n + nvars++], PREFIX "IMAGE=%s",
		     opt_val[O_IMAGE] ? opt_val[O_IMAGE] : "") < 0 ||
	    asprintf(&envp[n + nvars++], PREFIX "NAME=%s",
		     opt_val[O_NAME] ? opt_val[O_NAME] : "") < 0 ||
	    asprintf(&envp[n + nvars++], PREFIX "SAVE=%s",
		     opt_val[O_SAVE] ? opt_val[O_SAVE] : "") < 0 ||
	    asprintf(&envp[n + nvars++], PREFIX "PREPARE=%s", mode) < 0 ||
	    pipe2(pfd, O_CLOEXEC)) {
		for (i = 0; i < nvars; i++)
			free(envp[n + i]);
		free(envp);
		return 125;
	}
	pid = fork();
	if (pid == 0)
		check_child(pfd[1], envp, uid, gid, gids, ngids);
	close(pfd[1]);
	buf[0] = '\0';
	while (pid > 0 && ((got = read(pfd[0], buf + len, sizeof(buf) - 1 - len)) > 0 ||
			   (got < 0 && errno == EINTR))) {
		if (got < 0)
			continue;
		len += got;
		buf[len] = '\0';
		if (len == sizeof(buf) - 1) {       /* keep the last half: the error */
			memmove(buf, buf + len - sizeof(buf) / 2, sizeof(buf) / 2);
			len = sizeof(buf) / 2;
			buf[len] = '\0';
		}
	}
	close(pfd[0]);
	for (i = 0; i < nvars; i++)
		free(envp[n + i]);
	free(envp);
	if (pid < 0) {
		slurm_error("gpusandbox: cannot fork to check the image: %m");
		return 125;
	}
	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR)
			return 125;
	status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
	if (status) {
		error_line(buf, line, sizeof(line));
		for (i = 0; line[i]; i++)
			if (iscntrl((unsigned char) line[i]))
				line[i] = '?';
		slurm_error("%s", line[0] ? line : "gpusandbox: the check failed");
	}
	return status;
}

static int enabled(void)
{
	return opt_val[O_IMAGE] || opt_val[O_NAME] || opt_val[O_SAVE];
}

/*
 * Once per node and step, before any task is forked (as the job's user
 * after slurmstepd dropped its privileges): resolve the image and pull it on
 * a miss, so a missing image fails the step with one line and the tasks find
 * it in the store; take the named container, or the step's own for
 * --container-save.  An error here does not fail the job (spank(7)), so the
 * status is kept for task_init.
 */
int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
	(void) ac;
	(void) av;
	if (!enabled() || !task_prog)
		return 0;
	prepare_status = run_check(sp, "1");
	prepared = prepare_status == 0;
	return 0;
}

/*
 * In slurmstepd (root), as each task of the node is reaped: once the last one
 * has ended, write --container-save's file as the job's user (pyxis's rule:
 * the node's last task to end saves; only when the check passed).
 */
int slurm_spank_task_exit(spank_t sp, int ac, char **av)
{
	uint32_t ntasks = 0;

	(void) ac;
	(void) av;
	if (!opt_val[O_SAVE] || !prepared || !task_prog)
		return 0;
	if (spank_get_item(sp, S_JOB_LOCAL_TASK_COUNT, &ntasks) != ESPANK_SUCCESS)
		return -1;
	if (++tasks_ended != ntasks)
		return 0;
	prepared = 0;
	/* Its error line is the one the user sees: a failing task_exit would add
	 * two lines of Slurm's and change nothing (the status is the task's). */
	run_check(sp, "save");
	return 0;
}

/* In the task child, as the job's user: hand the task to task=PROG. */
int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
	int argc = 0, i;
	char **argv = NULL;
	uint32_t step = 0;

	(void) ac;
	(void) av;
	if (!enabled())
		return 0;
	if (prepare_status)         /* told once by user_init; every task fails */
		_exit(prepare_status);
	if (!task_prog) {
		slurm_error("gpusandbox: plugstack.conf names no task=PROGRAM; "
			    "rerun `gpusandbox slurm install-plugin`");
		return -1;
	}
	if (spank_get_item(sp, S_JOB_ARGV, &argc, &argv) != ESPANK_SUCCESS ||
	    argc < 1 || !argv || !argv[0]) {
		slurm_error("gpusandbox: the task has no command to run");
		return -1;
	}
	/* Only what this step's options say reaches the task program. */
	spank_unsetenv(sp, PREFIX "PREPARE");
	spank_unsetenv(sp, PREFIX "BATCH");
	if (spank_get_item(sp, S_JOB_STEPID, &step) == ESPANK_SUCCESS &&
	    step == SLURM_BATCH_SCRIPT &&
	    spank_setenv(sp, PREFIX "BATCH", "1", 1) != ESPANK_SUCCESS)
		goto fail;
	for (i = 0; i < O_COUNT; i++) {
		if (!opt_val[i])
			spank_unsetenv(sp, opt_env[i]);
		else if (spank_setenv(sp, opt_env[i], opt_val[i], 1) != ESPANK_SUCCESS)
			goto fail;
	}
	if (!opt_val[O_ENTRYPOINT] &&
	    spank_setenv(sp, opt_env[O_ENTRYPOINT], execute_entrypoint ? "1" : "0", 1)
	    != ESPANK_SUCCESS)
		goto fail;
	if (spank_setenv(sp, PREFIX "ARGV0", argv[0], 1) != ESPANK_SUCCESS)
		goto fail;
	argv[0] = strdup(task_prog);
	return argv[0] ? 0 : -1;
fail:
	slurm_error("gpusandbox: cannot set the task's environment");
	return -1;
}

int slurm_spank_exit(spank_t sp, int ac, char **av)
{
	int i;

	(void) sp;
	(void) ac;
	(void) av;
	for (i = 0; i < O_COUNT; i++) {
		free(opt_val[i]);
		opt_val[i] = NULL;
	}
	free(task_prog);
	task_prog = NULL;
	return 0;
}
