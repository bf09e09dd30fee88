#!/usr/bin/env python3
"""bench.py: measure supervisor.py against the performance targets P0-P17.

    python3 scripts/bench.py [--python PATH] [--json PATH] [--pairs N] [--quick]
                             [--pairs-big N] [--only P0,P1,...] [--nemo PATH]
                             [--pyz PATH] [--coverage] [--density-n N]
                             [--density-rounds R]

Takes ~14 minutes on two vCPUs (--quick: ~6). --only runs some groups, for
development. COV (the test suite's coverage of supervisor.py) runs only when
asked, by --coverage or --only COV: it runs the whole test suite. Under a
pyenv shim the bench may run as the shim's child: to stop it, Ctrl-C (the
whole foreground group) or signal the bench's own pid.

The interpreter. Every row runs one interpreter, PY, whose site loads no
.pth: a site .pth that imports a package (a pyenv build's can import
certifi, typing, re and more) costs tens of ms at every start, before any
script, and would hide every start-up ratio. PY is checked first (SITE_PROBE,
run as `PY -I` and as `PY -I -S`): no .pth in its site directories, nothing
imported beyond the bare set (what site itself imports with no site
directory: itself, and on Debian the standard library's sitecustomize),
nothing on sys.path beyond the site directories. --python PATH names it
(refused, in one line, if it is not clean); without it the bench takes the
first clean one of /usr/bin/python3, /usr/local/bin/python3 and its own
interpreter, and where none is, it makes one for the run: a venv of the
first of them whose venv is clean, with its site-packages removed (the same
binary and standard library; run by the venv's path, which a resolved path
would lose). The header, the JSON (machine.python*) and docs/performance.md
say which, and why. A pyenv shim or any script is refused.

Every row runs a copy of supervisor.py taken when the bench starts (in its
temporary folder; the header and the JSON give its version, commit and
sha256, and a note says when the project's file changed meanwhile): one
run measures one version while others edit the file. COV alone measures
the project's file, through the test suite.

Every row runs PY as `PY supervisor.py ...` (P0: also as a module and as the
pyz), measured side by side with its yardstick in the same run: pairs are
interleaved, and the order inside a pair alternates (ABBA) so neither side
always runs on a warmer cache. One warm-up pair is dropped. Durations come
from time.perf_counter / time.monotonic; CPU time from the first field of
/proc/PID/schedstat (ns on CPU, still readable while the process is a
zombie, which the bench checks at start) unless the row says otherwise.

The load. The machine is shared (a guest may run beside the bench), which is
why every figure is a ratio or a difference against a yardstick run in the
same pairs. Each row also says the load it ran under: /proc/loadavg sampled
at every run started (at most every 0.25 s) from the start of the row's
measurements to the row: the 1-minute load average's min-max (the table's
load1 column), its first and last values, the 5-minute one at the end and
the median number of runnable tasks (the JSON's row.load). Rows computed
from the same runs (P0-x-cpu and -rss, P6 N=1000 and P8, P12's variants,
P16's three rows) share one window.

The runs' stderr goes to a file per section (P0, P1, ...): the notes give
each section's first lines and count its tracebacks by their last line and
the file of their last frame, with the cause where it is known.

Containments. supervisor.py holds a run in a cgroup v2 of its own where it
can make one (--containment auto, the default: receipt "cgroup"), else by
the /proc walk over the children files (--containment proc: receipt
"children"). A row whose name does not say otherwise runs the default, and
its text ends in [the containment its receipts gave]; rows without a receipt
(P1, P2, P5, P9a, P10a, P10c) say what auto chose in the probe the bench runs
first (`--timeout 600 -- true` with a receipt). The probe also tells whether
--containment cgroup works, on the host and in the PID namespace of P12 and
P13 (rows that need it are skipped with a note where it does not). The
policy is the default, drain-all: the stop signal goes to every process of
the run, and a stop that had to SIGKILL the command exits 137 (as
timeout(1)), else 124 at a deadline or stop file, 128+N at signal N; each
run's status is checked.

How each row is measured
  P0  the start-up as the controller runs it. P0-lines: the code lines of
      supervisor.py, counted as the project's codelines.py counts them (a
      line holding a token that is neither a comment nor part of a
      docstring, the first statement of a module, class or function when it
      is a string). Checked: <= 3250 (the budget of this round, issue #29).
      Beside NeMo Gym's process_supervisor.py (at commit 978ad55, given with
      --nemo PATH, fetched into a temporary folder and never added to the
      project; without --nemo only P0-lines runs, with a note), each side
      `... --timeout 60 --receipt R -- true`, run from the bench's workdir,
      max(20, pairs) interleaved ABBA pairs after one dropped, three ways:
        P0-script  `PY -I process_supervisor.py`: supervisor.py copied under
                   NeMo Gym's name into a folder of its own, as the drop-in
                   it is (compiled from source at every start);
        P0-module  `PYM -I -m supervisor`: PYM is a venv of PY's binary
                   whose site-packages holds supervisor.py and the bytecode
                   compiled there at once (as an install does; -I keeps
                   PYTHONPATH and the working directory off sys.path), and
                   no .pth (checked as PY is); NeMo Gym's side runs by PYM
                   too;
        P0-pyz     `PY -I treereap.pyz`: --pyz PATH (checked with
                   `build_pyz.py --check`: it must hold this supervisor.py),
                   else built for the run by scripts/build_pyz.py into the
                   temporary directory (a pyc per CPython 3.6-3.13 it
                   finds; a note where none is PY's).
      NeMo Gym's script is copied likewise into its own folder; every run
      writes a new receipt (R is removed after each), exit 0 and the
      receipt's cleanup_confirmed are checked. Each run is under
      /usr/bin/time (GNU time: a parent smaller than either side, since a
      child's peak RSS starts at its parent's at the fork): CPU is user +
      system from the bench's wait4 of time (time, ~1 ms, and all it
      reaped: the supervisor and its `true`), peak RSS is time's %M (the
      ru_maxrss of its wait4 of the supervisor). Rows P0-WAY-cpu and
      P0-WAY-rss: median(ours) / median(NeMo Gym's), the per-pair ratios'
      median in the JSON. Checked (P0_LIMITS, issue 31): P0-pyz-cpu <= 0.6,
      P0-pyz-rss <= 0.85, P0-script-cpu <= 1.5; the others are info.
      P0-site (info): `PY -I -c pass` over `PY -I -S -c pass`, the same way:
      what site costs on PY with no .pth.
  P1  startup: wall time (posix_spawn to waitpid) of
      `PY supervisor.py --timeout 600 -- true` vs `PY -c pass`; and the same
      with `-I -S` on both sides. Checked: difference of the medians.
      P1c (info): Python compiles supervisor.py from source on every start
      (no .pyc for __main__): compile(source bytes, path, "exec") timed in
      PY (10 times after one dropped; median, min in the JSON), its share
      of the P1 difference (compile ms / P1 diff ms, the diff/ratio
      column), and the file's line count.
      P1-m: `PY -m supervisor` (PYTHONPATH its directory) vs `PY -c pass`:
      the import system loads the bytecode it cached (a warm-up pair writes
      it), so no parse at start. Checked: difference of the medians <= 15 ms.
  P2  command exit -> supervisor exit, the issue's definition:
      median(`-- sleep 0.2`) - median(`-- true`) - 200 ms. P2b, the same
      thing measured directly: the command writes time.monotonic() and exits
      after 0.1 s; the bench notes time.monotonic() when waitpid returns for
      the supervisor; the yardstick is the same command run by the bench
      itself (process exit + the bench's wake-up).
  P3  deadline -> first SIGTERM: the command blocks SIGTERM at once and
      waits for it with sigwaitinfo, then writes time.time(). Deadline =
      receipt started_at (UTC, microseconds) + --timeout 0.2.
  P4  stop file -> first SIGTERM: the same helper says "ready"; the bench
      notes time.monotonic() and creates the stop file in a directory under
      the temporary directory (its filesystem type is reported).
      Both P3 and P4 see the SIGTERM when it is delivered, i.e. after the
      supervisor's thaw (it freezes the run's cgroup, or stops the group
      and walks /proc, then sends SIGTERM and thaws or SIGCONTs): the
      latency includes that look.
  P4b info: the same runs, stop file -> the supervisor's exit (the helper
      exits at its SIGTERM): what a controller waiting for the exit waits.
  P5  idle CPU: ~30 supervisors `--timeout 600 --stop-file F -- sleep 60` and
      as many `PY -c "import time; time.sleep(60)"` run at once; after they
      settle, schedstat is sampled at t0 and t0+10 s, scaled to a minute; a
      supervisor's figure is its own plus its lookout's (the child of its
      that looks at the stop file).
      The read/write syscall counts (/proc/PID/io) over the same window are
      reported too: a /proc scan would show up there as thousands of reads.
  P6  forced stop of N processes that obey SIGTERM (N = 10, 100, 1000): the
      command is a helper that forks N-1 children in its process group and
      prints "ready". T0 = SIGTERM to the supervisor; end = the supervisor
      has exited (waitid WNOWAIT; the receipt is written and fsynced before
      exit). Yardstick: the bench (a child subreaper) starts the same helper
      in a new group, then killpg(SIGTERM) and waitpid until all N are reaped.
      The JSON also gives SIGTERM -> the receipt's ended_at (supervise()
      returned; before the receipt write and the interpreter's exit).
  P7  the same with SIGTERM ignored, --cleanup-timeout 0.2 (the grace); the
      yardstick sends SIGKILL after the same 0.2 s. Checked: median - grace
      against the P6 target. The command is SIGKILLed too: exit 137.
  P8  supervisor CPU from the stop decision to its exit in the P6 N=1000
      runs: schedstat just before SIGTERM and on its zombie (not wait4's
      rusage, which adds the CPU of the children it reaped).
  P9  5,000 unrelated `sleep 600` (the bench's children, in one new process
      group, killed with killpg and reaped at the end): P5 again with 20
      supervisors (idle CPU and syscalls; "no change" = read+write syscalls
      per minute within 10% of the quiet P5's, and CPU within 2x or 5 ms/min
      of it: idle figures are a few ms/min and wobble between runs, while one
      scan of 5,000 processes costs ~15,000 syscalls and ~45 ms) and P8
      again (ratio to P8 <= 2).
      P9c (info) repeats P4 on the busy host (10 runs).
  P10 peak RSS: VmHWM of /proc/PID/status sampled every ~1 ms until exit,
      for `-- sleep 0.5` and for a stopped N=1000 tree (20 triples), vs the bare
      `PY -c "import time; time.sleep(1)"` running at the same time. Not
      wait4's ru_maxrss: it adds the children's peaks, and posix_spawn's
      vfork-style child hands the bench's own peak to the exec'd process.
      P10c idle RSS: VmRSS of `PY supervisor.py --timeout 600 -- sleep 60`
      and of the bare `PY -c "import time; time.sleep(60)"`, started side by
      side (which one first alternates), both read at the same moment, 0.5 s
      after the supervisor's command runs (its children file names it), when
      the supervisor has settled. Both are then stopped with SIGTERM (the
      supervisor's exit 143 is checked). max(pairs-big, pairs / 2) pairs
      after one dropped. Info (no target): run as a script, CPython compiles
      supervisor.py from source and keeps the script's parse tree until the
      script returns, which for the supervisor is the end of the run: ~10 MiB
      over the bare interpreter on 3.11.
      P10c-m: the same for `PY -m supervisor` (bytecode cached by a warm-up
      run where the directory allows): the import system loads the cached
      bytecode, with no parse tree to keep, as the installed `treereap`
      command does. Checked: difference of the medians <= 4.5 MiB.
  P11 crowded host: the P6 stop of N=100 (SIGTERM -> exit, and the
      supervisor's CPU as in P8), on the quiet host and with P9's 5,000
      sleeps present (the bench's children, not the supervisor's). Starting
      them takes seconds, so the pairs are of blocks, ordered ABBA (quiet,
      crowded | crowded, quiet | ...; 12 blocks, --quick 4), ~pairs runs a
      side (ceil(pairs / 6) a block; --quick: pairs / 2): the sleeps start
      and stop once per two blocks. In every block the two containments
      take turns, each going first in turn: --containment proc (the walk by
      children files, receipt "children") and --containment cgroup (receipt
      "cgroup"; left out, with a note, where the probe found no cgroup); the
      block's first run of each is dropped. Checked, for each: crowded/quiet
      ratio of the medians <= 1.5, of the CPU (P11a, P11a-cgroup) and of the
      wall time (P11b, P11b-cgroup).
  P12 storm: `PY respawner.py tree 8 0.002 4000` (tests/helpers; 255
      processes, each in a session of its own, the 128 leaves replacing
      themselves every 2 ms), under `--timeout 3 --cleanup-timeout 2` (3 s:
      the storm is READY first, ~1 s here; with the tests' 1 s the deadline
      often came first, and the storm's nodes still reporting to their dead
      root died of BrokenPipeError, tracebacks in the runs' stderr); as
      root inside `unshare --pid --fork --mount-proc` (the supervisor is PID 1
      of a namespace of its own: nothing escapes, and the namespace dies with
      it), else directly (the sweep reaps and kills by pid what is left).
      Five variants, min(pairs-big, 5) runs each (--quick 3), no warm-up:
      every run counts; the variants are interleaved (one run of each per
      round, each going first in turn):
        P12              the default containment, quiet. Checked:
                         cleanup_confirmed in every run and the receipt's
                         duration_s <= timeout + 3 x cleanup + 2 s = 11 s
                         in every run (the max). P12-drain (info): its
                         receipts' draining step.
        P12-cgroup       --containment cgroup, quiet;
        P12-cgroup-load  the same with two busy loops beside it. Checked:
                         cleanup_confirmed in every run and the receipt's
                         draining step <= 1 s in every run (the max).
        P12-proc         --containment proc (children files), quiet;
        P12-proc-load    the same, loaded. Info: the walk is a race for the
                         CPU with the respawning leaves; the number of runs
                         confirmed is the figure (in the target column).
      The cgroup variants are skipped, with a note, where the probe found
      no cgroup in the namespace. Loaded: BUSY_LOOPS = 2 `PY -c "while 1:
      pass"`, the bench's children in a process group of their own, outside
      the run, started when the storm says READY (or at the deadline if it
      never does: under the loops from the start it mostly is not READY by
      then, and its root, which ignores SIGTERM only once READY, dies at the
      first signal) and killed by their group, and reaped, after the run.
      Each row's samples are the receipts' draining step (ms; P12: the
      duration_s), its text gives the median duration_s, its target column
      the runs confirmed out of those planned. The exit status is 137 when
      the storm was READY (its root ignores SIGTERM: it is SIGKILLed) and
      124 when the deadline came first (125, the cleanup not confirmed, is
      accepted from the proc variants only); runs that ended before READY
      are counted in a note. The JSON gives each variant's durations, draining
      steps, exit statuses, READY runs, when the loops started, the medians
      of the ladder's steps and the bench's wall time. A run still going
      after 30 s is killed, and that variant stops there (a miss). The storm
      runs without -I -S, as the tests run it: under -I -S the interpreter
      is smaller and forks about twice as fast, a harsher storm.
  P13 many sessions: a forced stop of 5,000 processes, each in a session of
      its own with SIGTERM ignored: a helper the bench writes forks 5,000
      children that setsid(), ignore SIGTERM and exec `sleep 600`, and says
      "READY" once all have exec'd; in the PID namespace as P12 when root.
      Default --cleanup-timeout (10 s), stopped by a stop file after READY:
      the grace runs out, then SIGKILL and the drain. For P13-children
      (--containment proc) and P13-cgroup (--containment cgroup; skipped,
      with a note, without one); 2 runs each, --quick 1, interleaved.
      Checked: cleanup_confirmed and the receipt's draining step <= 10 s
      (the default budget) in every run. The text gives the median
      duration_s; the JSON the ladder's steps and stop file -> exit. The
      bench reads the 5,000 pids and start times below the helper before the
      stop; after the run any of them still alive (none can be, in the
      namespace) is noted and killed by its process group (each leads its
      own), then reaped. A run still going 50 s after the stop file is
      killed (a miss).
  P14 a receipt of many processes with huge argv: the command (a helper
      the bench writes) starts 1,000 `sh -c 'sleep 600; :' x A1..A10`, each
      argument 7,000 bytes that are not UTF-8 (0xff; about 70 KB of argv
      each; sh keeps its argv, as it has work after the sleep, and forks the
      sleep), says "READY" once all have exec'd sh and forked their sleep,
      and is stopped by a stop file: 2,001 processes to drain, 1,000 of them
      with long argv. A receipt entry holds a process name (/proc/PID/stat,
      at most 15 bytes), never argv, and every list but `preserved` holds at
      most 1,000 entries: the receipt's size is bounded by construction,
      whatever the argv. 5 runs (--quick 2) after one dropped; the exit
      status 124 is checked, and the receipt's schema_version: the one
      supervisor.py declares (RECEIPT_SCHEMA_VERSION, read from the file),
      4 or later (names, never argv, since 4); P14-size's text gives it.
      P14-size: the receipt's size; checked: max <= 128 KiB.
      P14-list: checked: drained_count = 2,001 and 1,000 entries listed in
      `drained`, in every run; a key of the old schema (an entry's `command`
      or `command_truncated`, the receipt's `omitted`) is noted.
      P14: the receipt's ended_at (the cleanup is over; wall clock, us) ->
      the bench's waitid seeing the supervisor's exit (time.time()): the
      receipt's building, write and fsync, and the interpreter's exit.
      Checked: max <= 1 s, a small part of exec_timeout()'s 30 s of slack.
      The JSON gives the sizes in bytes, drained_count and the entries
      listed, the longest name, and stop file -> exit.
  P16 a stop at the deadline of 1,000 processes obeying SIGTERM (the tree
      helper, argv[3] of them calling setsid()), two shapes: P16-group, all
      in the command's group; P16-sessions, 500 of them in sessions of their
      own. Beside NeMo Gym's (--nemo; the row is skipped without it) and
      GNU timeout (where on PATH), each `--timeout 2` (the tree is ready
      well before: a run whose ready line came after the deadline is left
      out, with a note): ours `PY supervisor.py --timeout 2 --workdir W
      --receipt R -- TREE`, theirs `PY -I process_supervisor.py --timeout 2
      --receipt R -- TREE`, `timeout 2 TREE`. Rounds of one run each, the
      order rotating, pairs-big rounds after one dropped. Measured: the
      deadline -> the exit, as the bench's waitid (WNOWAIT) sees it, the
      receipt being then on disk and confirmed (checked: ours exits 124 and
      NeMo Gym's 0, its receipt timed_out). The deadline: ours', its
      receipt's started_at + 2 s (its deadline is taken just before its
      fork); NeMo Gym's and timeout's, their command's exec + 2 s (NeMo
      Gym's takes it when Popen returns, after the exec), dated by the tree
      helper's time.monotonic() at its first statement minus the exec ->
      first statement offset, measured in every round by the bench
      spawning the same helper (posix_spawn returns at its exec; the
      median, ~6 ms, in the JSON; ours dated that way too, in the JSON).
      Checked: median(ours) / median(NeMo Gym's) <= 1, every run of both
      confirmed. P16-ref-SHAPE (reference): timeout's (it exits when its
      child does, draining nothing; in the sessions shape it leaves 500
      alive, which the bench kills). P16c-SHAPE (info): each supervisor's
      CPU (schedstat) from the ready line to its exit; the JSON gives ours'
      ladder steps (medians).
  P17 --output F --max-output 1M, F in the bench's directory (its
      filesystem in the JSON). P17a: the command `sh -c 'sleep 0.2; exec
      dd if=/dev/zero bs=1M count=1024 status=none'` writes 1 GiB as fast
      as it can; the yardstick, the same command into a pipe as large as
      the supervisor's (1 MiB, F_SETPIPE_SZ) that `cat > FILE` beside F
      copies. The supervisor's CPU (schedstat of its own process, not its
      children) from 0.05 s after its command appears in its children file
      (its start-up done, the writer still asleep) to its exit; cat's
      user+sys from wait4 (cat alone). The JSON also gives the supervisor's
      whole run and the same span by /proc/PID/stat utime+stime (ticks).
      Checked: median(supervisor) / median(cat) <= 1.2, pairs-big ABBA
      pairs after one dropped; the receipt's output must have seen 1 GiB
      and F must stay within the cap. P17b: the command writes one byte
      every 200 us for 8 s (TRICKLE_HELPER: a Python loop paced by the
      clock), and at its end its own CPU
      (time.process_time()); the supervisor's CPU as in P17a. Checked:
      median(supervisor) / median(the command's own) <= 1; 3 runs (--quick
      1), each beside the same trickle into cat (cat's CPU and the us per
      byte of each in the JSON).
  P18 density, as a controller runs hundreds of sandboxes on one node:
      --density-n N supervisors at once (default 200), each running
      `sh -c 'setsid sleep 600 & sleep 600'` (a sleep in the command's
      group, one in a session of its own), all given one absolute deadline;
      three ways one after another, the order rotating over
      --density-rounds R rounds (default 1): the pyz `PY -I treereap.pyz`
      (as P0), the script `PY -I supervisor.py` (a copy) and NeMo Gym's
      `PY -I process_supervisor.py` (--nemo; the row is skipped without
      it), each with --receipt R (ours also --workdir W) and --timeout
      DEADLINE - now, computed just before its spawn. The deadline is
      N x 0.2 s + 11 s after the way's first spawn; the supervisors start
      one after another, the next once the last one's command is forked
      (its children file), so none starts among a crowd of start-ups
      (a way that has not started all N with 11 s to spare fails the
      bench). Beside them, 20 bare `PY -I -c "import time;
      time.sleep(600)"`. Measured, once every tree is whole (sh and both
      sleeps, one of them leading its own session) and 1 s more:
        P18-rss-WAY   VmRSS of each supervisor, the median over the bare
                      interpreters' median (max in the JSON). Checked for
                      the pyz: <= 3.5 MiB; script and NeMo Gym's: info.
        P18-idle-WAY  the CPU of all N together (schedstat's first field,
                      each supervisor and its forks) from then to 1 s
                      before the deadline, in ms per minute of waiting,
                      and their wake-ups (schedstat's third field: times
                      run on a CPU). Checked for ours: no wake-up at all.
        P18-stop-WAY  from the shared deadline to the last supervisor's
                      exit, as the bench's waitpid(-1) sees it (the bare
                      interpreters are gone by then: only the N stop).
                      Checked for ours: median over the rounds <= NeMo
                      Gym's (ratio <= 1), every receipt confirmed (ours
                      exit 124, stop_reason timeout; NeMo Gym's exit 0,
                      timed_out), no process of the N trees alive after
                      (the pid with its start time, not a zombie); those
                      left are killed by pid (the bench, a subreaper,
                      holds them). NeMo Gym's row: reference.
      Each supervisor's own deadline falls after the shared one by its
      start-up (spawn -> deadline taken): the JSON gives it, as the
      command's fork time (/proc/PID/stat, 10 ms ticks) + its --timeout -
      the shared deadline (own_deadline_lag_ms). A supervisor still
      running 60 s after the deadline is killed (a miss). Run only this
      row: --only P18 --nemo PATH.
  ref rows: GNU timeout / tini, when on PATH, for P1, P2 and P6 (timeout and
      tini exit when their child exits: they do not wait for the tree).
  COV statement coverage of supervisor.py by the project's test suite,
      subprocesses included (only with --coverage or --only COV: it runs the
      whole suite, some minutes under measurement). coverage.py must be in
      the project's venv (.venv/bin/python -m pip install coverage); the
      bench installs no package. It writes a config into its temporary
      directory: [run] parallel = true, include = supervisor.py's real path
      (coverage records files by their real paths: treereap.py, a link, is
      the same file), data_file in a directory of its own under the system's
      temporary directory with mode 1777 (some tests run processes as
      nobody), and, where the venv's coverage has them (7.10.4 and later),
      patch = subprocess, _exit, fork, execv: the Python processes started
      from the venv's interpreter measure themselves, data is saved at
      os._exit (how the supervisor exits), forked children measure
      themselves too, and save before an exec (else the command's setup in
      the supervisor's child, between its fork and the exec of the command,
      would never be saved and would look dead).
      Coverage starts from the environment, COVERAGE_PROCESS_START = the
      config, by the .pth file coverage 7.x keeps in site-packages; where the
      venv's interpreter does not (checked first), the bench adds a .pth of
      its own that calls coverage.process_startup(). The tests run some
      supervisors as nobody under a system python3 (tests/test_trust.py:
      the venv's interpreter is under /root, out of nobody's reach): where
      /usr/bin/python3 or /usr/local/bin/python3 has the venv's minor
      version, the bench puts a .pth in its site-packages that, only when
      coverage's variables are set, imports coverage from the venv's
      site-packages and starts it (else a note). Every .pth the bench adds
      is removed after the suite (one left by a killed bench does nothing
      without those variables). The suite runs as `.venv/bin/python -m pytest -q` from the
      project's root, in a session of its own (a failing test is noted, not
      fatal: the lines it ran still count; under measurement every Python
      process is slower and saves data files, and a few tests that bound
      time or count file descriptors may fail; a suite still running after
      30 minutes fails the bench); then `coverage combine` and `coverage json`
      of supervisor.py. Checked: the percentage of statements executed >=
      90 %. The JSON gives the never-executed lines and their ranges
      (consecutive among the statements, as coverage's report merges them),
      each with the innermost function or class it is in; the notes give
      their count and the first 30. Not measured (a note says so): a process
      whose data is never saved (ended by SIGKILL), supervisors run with -S
      (no site, so no .pth; tests/test_trust.py's descriptor limits do, and
      there no descriptor would be left for coverage either), runs by other
      interpreters (test_pythons.py's) and copies of the file under another
      path. -I alone is measured: it ignores PYTHON*
      variables and the user's site directory, not site-packages' .pth files
      nor COVERAGE_PROCESS_START.

Rows with N=1000 use fewer pairs (--pairs-big) to stay within ~5 minutes on
two cores; the table's N column says how many (P11: runs a side, P12-P14:
runs with a receipt). Everything the bench starts is its own child or is
adopted by it (it is a child subreaper; a P12 storm or the P13 sleeps in
their PID namespace die with the namespace); at the end, and on Ctrl-C or
an error, it kills its remaining children by pid (unreaped, so the pid is
still theirs), the 5,000 sleeps and the busy loops by their process
groups, reaps everything, and removes its temporary directory.

Exit status: 0 every checked row passed, 1 some row missed its target,
2 the bench failed or was refused, 130 interrupted.
"""
import argparse
import ctypes
import datetime
import gc
import json
import os
import platform
import re
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The project's file; the rows run a copy of it taken at the bench's start
# (main() points SUPERVISOR there), so that one run measures one version of
# it while the file is being edited. COV measures the project's file.
PROJECT_SUPERVISOR = SUPERVISOR = os.path.join(ROOT, "supervisor.py")
BUILD_PYZ = os.path.join(ROOT, "scripts", "build_pyz.py")
# `PY -m supervisor`, its directory on PYTHONPATH: the import system loads the
# cached bytecode (__pycache__) instead of parsing the file at every start,
# and drops the parse tree, which CPython keeps for a script while it runs.
MODULE = "supervisor"
PR_SET_CHILD_SUBREAPER = 36
TIME = "/usr/bin/time"  # P0: GNU time, a parent smaller than either side
GRACE = 0.2            # P7: --cleanup-timeout, and the yardstick's SIGTERM -> SIGKILL wait
P3_TIMEOUT = 0.2       # P3: the deadline
IDLE_WINDOW = 10.0     # P5/P9: seconds between the two CPU samples
BUSY_HOST = 5000       # P9/P11: unrelated processes
READY_TIMEOUT = 60.0   # a helper that is not ready by then is an error
COMPILE_REPEATS = 10   # P1c: compile() timings of supervisor.py (after one dropped)
CROWD_N = 100          # P11: the forced stop measured on the quiet and the crowded host
CROWD_LIMIT = 1.5      # P11: crowded / quiet, CPU and wall
# P12: the test suite's storm, 255 processes in sessions of their own whose 128
# leaves replace themselves every 2 ms (at most 4000 times); its bound. Run as
# the tests run it, `PY respawner.py`: under -I -S the interpreter is smaller
# and forks about twice as fast, which is a harsher storm than the tests'.
RESPAWNER = os.path.join(ROOT, "tests", "helpers", "respawner.py")
STORM = ["tree", "8", "0.002", "4000"]
# The deadline comes once the storm is READY (~1 s here): at the tests' 1 s it
# often came first, the root died, and the nodes still reporting to it died
# of BrokenPipeError (tracebacks in the runs' stderr), with no storm stopped.
STORM_TIMEOUT, STORM_CLEANUP = 3.0, 2.0
STORM_BOUND = STORM_TIMEOUT + 3 * STORM_CLEANUP + 2.0
STORM_ABORT = 30.0     # P12: a run still going by then is killed (a miss, and no more runs)
STORM_DRAIN_LIMIT = 1.0  # P12-cgroup: the receipt's draining step, every run
# P12's variants, interleaved: (row, containment (None: the default, auto),
# two busy loops beside it).
STORM_VARIANTS = (
    ("P12", None, False),
    ("P12-cgroup", "cgroup", False),
    ("P12-cgroup-load", "cgroup", True),
    ("P12-proc", "children", False),
    ("P12-proc-load", "children", True),
)
BUSY_LOOPS = 2         # P12 "loaded": CPU-bound loops beside the storm
BUSY_LOOP = "while 1: pass"
IDLE_RSS_SETTLE = 0.5  # P10c: seconds after the command runs before VmRSS is read
IDLE_RSS_LIMIT = 4.5   # P10c-m: supervisor idle RSS - bare idle RSS, MiB (P10c: info)
# P13: a forced stop of many processes in sessions of their own, all ignoring
# SIGTERM, under the default cleanup timeout (the grace runs out, then SIGKILL).
MANY_N = 5000
MANY_CLEANUP = 10.0    # supervisor.py's default --cleanup-timeout; the drain's budget
MANY_ABORT = 3 * MANY_CLEANUP + 20.0  # stop file -> still running: killed (a miss)
# P14: ARGV_N sh processes with ARGV_COUNT arguments of ARGV_BYTES each (sh
# keeps its argv: `sleep 600; :` has work after the sleep), and their sleeps.
ARGV_N, ARGV_COUNT, ARGV_BYTES = 1000, 10, 7000
ARGV_DRAINED = 2 * ARGV_N + 1  # the sh's, their sleeps and the helper
RECEIPT_LIST_LIMIT = 1000  # supervisor.py's _LIST_LIMIT: entries listed in `drained`
RECEIPT_SIZE_LIMIT_KIB = 128.0  # names, not argv: ~40 bytes an entry, whatever the argv
RECEIPT_EXIT_LIMIT = 1.0   # receipt ended_at -> the supervisor's exit, s
# P14: names, never argv, and bounded lists: since schema 4. The receipt must
# give the schema supervisor.py declares (RECEIPT_SCHEMA_VERSION), 4 or later.
RECEIPT_SCHEMA_MIN = 4
# COV: the suite's statement coverage of supervisor.py, subprocesses included.
VENV_PYTHON = os.path.join(ROOT, ".venv", "bin", "python")
# coverage records a file by its real path: treereap.py (a link) is this too.
SUPERVISOR_REAL = os.path.realpath(PROJECT_SUPERVISOR)
COVERAGE_LIMIT = 90.0      # percent of statements executed
# execv too: a forked child's lines before its exec (the command's setup: --user,
# the cgroup, the terminal) are otherwise never saved, and would look dead.
COVERAGE_PATCHES = "subprocess, _exit, fork, execv"
COVERAGE_SUITE_ABORT = 1800.0  # s: a suite still running by then is killed (the bench fails)
COVERAGE_NOTE_RANGES = 30  # ranges printed as notes (all of them are in the JSON)
# Where tests/test_trust.py looks for a python3 the user nobody can run.
NOBODY_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")
# The interpreter of every row: one whose site loads no .pth (a site .pth that
# imports a package costs tens of ms before any script, and would hide every
# ratio). Without --python the bench looks at these, then at its own
# interpreter; where none is clean it makes one: a venv of one of them whose
# site-packages is removed (the same binary and standard library, no .pth).
PYTHON_CANDIDATES = ("/usr/bin/python3", "/usr/local/bin/python3")
NEMO_MIN_PYTHON = (3, 8)   # NeMo Gym's script imports typing.TypedDict
# Load: /proc/loadavg sampled at most this often while a row runs (and at
# its start and end), so each row says the load it was measured under.
LOAD_EVERY = 0.25
# P0: the start-up as the controller runs it, each way beside NeMo Gym's
# script: (way, measure) -> the target ratio to NeMo Gym's (issue 31); the
# other (way, measure) pairs are info.
P0_TIMEOUT = "60"
P0_LIMITS = {("pyz", "cpu"): 0.6, ("pyz", "rss"): 0.85, ("script", "cpu"): 1.5}
# P16: a stop at the deadline of STOP_N processes obeying SIGTERM, ours beside
# NeMo Gym's (and GNU timeout's): all in the command's group, or half of them
# in sessions of their own. The deadline leaves the tree time to be ready.
STOP_N = 1000
STOP_TIMEOUT = 2.0
STOP_SHAPES = (("group", 0), ("sessions", STOP_N // 2))
STOP_LIMIT = 1.0           # ours / NeMo Gym's, the medians
# P17: --output FILE --max-output 1M. A writer of OUTPUT_BYTES as fast as it
# can (dd, 1 MiB blocks), beside cat copying the same writer's pipe to a file
# on the same filesystem; and a trickle, one byte every TRICKLE_PERIOD for
# TRICKLE_SECONDS. The writer waits OUTPUT_DELAY before its first byte, so
# that the supervisor's CPU is sampled after its start-up and before it.
OUTPUT_BYTES = 1 << 30
OUTPUT_CAP = "1M"
OUTPUT_PIPE = 1 << 20      # supervisor.py's pipe size (F_SETPIPE_SZ): cat's pipe gets it too
OUTPUT_LIMIT = 1.2         # the supervisor's CPU / cat's
OUTPUT_DELAY = 0.2
TRICKLE_SECONDS, TRICKLE_PERIOD = 8.0, 0.0002
F_SETPIPE_SZ = 1031        # fcntl.F_SETPIPE_SZ (named there from 3.10)
# P18: density, as a controller runs hundreds of sandboxes on one node: N
# supervisors at once (--density-n), each a small tree in sessions of its own,
# all given one absolute deadline, one way at a time (the pyz, the script,
# NeMo Gym's script), in rounds whose order rotates (--density-rounds).
DENSITY_N = 200
DENSITY_COMMAND = ["sh", "-c", "setsid sleep 600 & sleep 600"]
DENSITY_SPAWN_EACH = 0.2   # s of the deadline's budget for each supervisor started
DENSITY_SETTLE = 1.0       # s after the last tree is whole before RSS is read
DENSITY_WINDOW = 10.0      # s: the shortest idle window (the spawns' leftover budget adds to it)
DENSITY_BARE = 20          # bare interpreters beside them: RSS's yardstick
DENSITY_RSS_LIMIT = 3.5    # MiB over the bare interpreter, each, the pyz (issue 38)
DENSITY_STOP_LIMIT = 1.0   # deadline -> last exit: ours / NeMo Gym's (medians of the rounds)
DENSITY_ABORT = 60.0       # s after the deadline: a supervisor still running is a miss, killed
DENSITY_WAYS = ("pyz", "nemo", "script")

# --- Helpers written into the temporary directory, run as `PY -I -S file` ----------------

# P6/P7/P8/P10/P16: N processes in the helper's own process group (P16: argv[3]
# of them in sessions of their own); SIGCHLD stays at its default so dead
# children stay zombies until the helper dies, and then go to the nearest
# subreaper (the supervisor, or the bench for the yardstick). Its ready line
# gives its pid and time.monotonic() at its first statement.
TREE_HELPER = r'''
import time
STARTED = time.monotonic()  # its first statement: P16 dates its exec by it
import os, signal, sys
def main():
    n, mode = int(sys.argv[1]), sys.argv[2]
    sessions = int(sys.argv[3]) if len(sys.argv) > 3 else 0  # P16: that many setsid()
    if mode == "ignore":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # inherited by the children
    for i in range(n - 1):
        if os.fork() == 0:
            try:
                if i < sessions:
                    os.setsid()
                while True:
                    signal.pause()
            finally:
                os._exit(0)
    os.write(1, ("ready %d %r\n" % (os.getpid(), STARTED)).encode())
    while True:
        signal.pause()
main()
'''

# P3/P4: SIGTERM blocked at once, then waited for; its arrival time is written
# to argv[1] ("wall monotonic"). With argv[2] it first says "ready" on stdout.
SIGWAIT_HELPER = r'''
import os, signal, sys, time
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
if len(sys.argv) > 2:
    os.write(1, b"ready\n")
signal.sigwaitinfo([signal.SIGTERM])
wall, mono = time.time(), time.monotonic()
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(fd, ("%r %r\n" % (wall, mono)).encode())
os.close(fd)
os._exit(0)
'''

# P13 and P14: argv[1] children, then "READY n" once every child has exec'd:
# the pipe's write end is close-on-exec, so its read end sees EOF when the
# last one has. argv[2] says what each child is. "sessions SLEEP": in a
# session of its own with SIGTERM ignored (kept through the exec), `sleep
# 600`. "argv COUNT BYTES SH": in the helper's group, stdio on /dev/null,
# `sh -c 'sleep 600; :' x A1..A_COUNT`, each argument BYTES long, not UTF-8;
# READY waits for every sh to have forked its sleep too (its children file),
# so that a stop right after READY finds all 2n + 1. The helper itself obeys
# SIGTERM.
FANOUT_HELPER = r'''
import os, signal, sys, time
def child(kind, args):
    if kind == "sessions":
        os.setsid()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.execv(args[0], ["sleep", "600"])
    count, size, sh = int(args[0]), int(args[1]), args[2]
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    # Not UTF-8 (0xff): each byte becomes U+FFFD, six characters of JSON.
    os.execv(sh, [sh, "-c", "sleep 600; :", "x"] + [b"%02d" % i + b"\xff" * (size - 2)
                                                    for i in range(count)])
def forked_once(pids):
    for pid in pids:
        path = "/proc/%d/task/%d/children" % (pid, pid)
        while True:
            with open(path) as f:
                if f.read().split():
                    break
            time.sleep(0.001)
def main():
    n, kind, args = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    read_end, write_end = os.pipe()  # close-on-exec (PEP 446)
    pids = []
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            try:
                child(kind, args)
            finally:
                os._exit(127)
        pids.append(pid)
    os.close(write_end)
    os.read(read_end, 1)
    if kind == "argv":
        forked_once(pids)
    os.write(1, ("READY %d\n" % n).encode())
    while True:
        signal.pause()
main()
'''

# P1c: compile(argv[1]) argv[2] times, each one's ms on stdout.
COMPILE_TIMER = ("import sys, time\n"
                 "source = open(sys.argv[1], 'rb').read()\n"
                 "for _ in range(int(sys.argv[2])):\n"
                 "    t0 = time.perf_counter()\n"
                 "    compile(source, sys.argv[1], 'exec', dont_inherit=True)\n"
                 "    print((time.perf_counter() - t0) * 1000)\n")

# P2b: sleep 0.1 s (so the supervisor is waiting when it exits), write
# time.monotonic() on stdout, exit at once.
EXIT_STAMP = ("import os, time; time.sleep(0.1); "
              "os.write(1, repr(time.monotonic()).encode()); os._exit(0)")

# P17b: one byte every argv[2] s for argv[1] s, paced by the clock (never a
# burst: a late byte is written at once, the next one a period later); then
# writes "bytes CPU-seconds wall-seconds" of its own to the file argv[3].
TRICKLE_HELPER = r'''
import os, sys, time
def main():
    seconds, period, stamp = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    start = time.monotonic()
    due, end, written = start, start + seconds, 0
    while due < end:
        now = time.monotonic()
        if due > now:
            time.sleep(due - now)
        os.write(1, b".")
        written += 1
        due = max(due + period, now)
    with open(stamp, "w") as f:
        f.write("%d %r %r\n" % (written, time.process_time(), time.monotonic() - start))
main()
'''

# The interpreter's check, run as `PY -I -c` and as `PY -I -S -c`. With -I it
# takes sys.modules and sys.path as site left them (its first statement);
# with -S it imports site and runs its main() with no site directory
# (addsitedir made to do nothing, so no .pth is read and nothing installed
# can be imported): the bare set, what site itself imports on this version
# (3.6's imports sysconfig; Debian's, the sitecustomize of its standard
# library). It also lists the site directories that exist and the .pth
# files in them.
SITE_PROBE = r'''
import sys
modules, path = set(sys.modules), list(sys.path)
if sys.flags.no_site:
    import site
    site.addsitedir = lambda sitedir, known_paths=None: known_paths
    site.main()
    modules, sys.path[:] = set(sys.modules), path
import json, os, site
dirs = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
if site.ENABLE_USER_SITE:
    dirs.append(site.getusersitepackages())
dirs = [d for d in dirs if os.path.isdir(d)]
print(json.dumps({"modules": sorted(modules), "path": path, "site_dirs": dirs,
                  "pth": sorted(os.path.join(d, n) for d in dirs for n in os.listdir(d)
                                if n.endswith(".pth")),
                  "version": list(sys.version_info[:3]), "cache_tag": sys.implementation.cache_tag,
                  "prefix": sys.prefix, "base_prefix": getattr(sys, "base_prefix", sys.prefix)}))
'''


class BenchError(Exception):
    """The bench cannot measure here; one line for the user."""


# Lines in the runs' stderr that a row causes on purpose: (section, how the
# line starts) -> the explanation the note gives.
KNOWN_STDERR = {
    ("P15", "treereap: cannot enforce the limits"):
        " (P15's probe of which limits this machine enforces: the ones refused are left out)",
    ("P15", "treereap: --memory-max"):
        " (P15's probe of which limits this machine enforces: the ones refused are left out)",
    ("P12", "treereap: cleanup not confirmed"):
        " (the /proc walk variants, P12-proc*, race the storm for the CPU: their rows count "
        "the runs confirmed)",
}
# Tracebacks in the runs' stderr whose cause is known: (exception, the file
# of the last frame) -> the explanation the note gives.
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b")
KNOWN_TRACEBACKS = {
    ("OSError", "respawner.py"):
        " (P12: a storm node forking in the run's PID namespace once its init, the"
        " supervisor, has exited: the kernel refuses the fork with ENOMEM; it follows the"
        " runs the /proc walk did not confirm)",
    ("BrokenPipeError", "respawner.py"):
        " (P12: the storm's nodes report to its root through a pipe; a root that died at"
        " the deadline before READY leaves the last nodes writing to a closed pipe:"
        " the run's notes say which runs were not READY)",
}


# --- Small tools -------------------------------------------------------------------------------

def median(values):
    return statistics.median(values) if values else float("nan")


def read_text(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def schedstat_ns(pid):
    """Nanoseconds pid has spent on a CPU (also for a zombie)."""
    text = read_text("/proc/%d/schedstat" % pid)
    if text is None:
        raise BenchError("cannot read /proc/%d/schedstat" % pid)
    return int(text.split()[0])


def stat_cpu_ticks(pid):
    """utime + stime of pid (also a zombie) in clock ticks: /proc/PID/stat,
    the process alone, not the children it waited for."""
    text = read_text("/proc/%d/stat" % pid)
    if text is None:
        raise BenchError("cannot read /proc/%d/stat" % pid)
    fields = text.rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def forks_of(pid):
    """pid's children that are forks of it, not execs: the supervisor's
    lookout (the child that looks at the stop file), whose CPU is its."""
    argv = read_text("/proc/%d/cmdline" % pid)
    kids = (read_text("/proc/%d/task/%d/children" % (pid, pid)) or "").split()
    return [int(c) for c in kids if read_text("/proc/%s/cmdline" % c) == argv]


def io_syscalls(pid):
    """read + write syscalls of pid so far (/proc/PID/io), or None."""
    text = read_text("/proc/%d/io" % pid)
    if text is None:
        return None
    fields = dict(line.split(": ") for line in text.splitlines() if ": " in line)
    return int(fields["syscr"]) + int(fields["syscw"])


def status_kib(pid, field):
    """A KiB field of /proc/PID/status (VmHWM: peak RSS, VmRSS: RSS now), or
    None once its memory is gone (a zombie)."""
    text = read_text("/proc/%d/status" % pid)
    if text:
        for line in text.splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return None


def vmhwm_kib(pid):
    """Peak RSS of pid in KiB, or None once its memory is gone (a zombie)."""
    return status_kib(pid, "VmHWM")


def start_time(pid):
    """The start time of pid (field 22 of /proc/PID/stat), or None if gone."""
    text = read_text("/proc/%d/stat" % pid)
    if text is None:
        return None
    return int(text.rsplit(")", 1)[1].split()[19])


def exit_code(status):
    """os.waitstatus_to_exitcode (3.9+): the exit code, or -N for signal N."""
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)


def has_exited(pid):
    """Has our child pid exited? Looks without reaping."""
    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    return info is not None


def wait_exited(pid):
    """Block until our child pid has exited, without reaping it."""
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)


def read_ready(fd, what, timeout=READY_TIMEOUT):
    """Read from fd until a whole line arrived; that line."""
    data, deadline = b"", time.monotonic() + timeout
    while b"\n" not in data:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        left = deadline - time.monotonic()
        if left <= 0 or not poller.poll(int(left * 1000) + 1):
            raise BenchError("%s: no ready line within %.0f s" % (what, timeout))
        chunk = os.read(fd, 4096)
        if not chunk:
            raise BenchError("%s: stdout closed before the ready line (%r)" % (what, data))
        data += chunk
    return data.split(b"\n", 1)[0].decode()


def filesystem_of(path):
    """The filesystem type of path from /proc/self/mountinfo (ext4, tmpfs, ...)."""
    path, best, fstype = os.path.realpath(path), "", "unknown"
    for line in (read_text("/proc/self/mountinfo") or "").splitlines():
        left, _, right = line.partition(" - ")
        mount_point = left.split()[4].replace("\\040", " ")
        if (path == mount_point or path.startswith(mount_point.rstrip("/") + "/")) \
                and len(mount_point) >= len(best):
            best, fstype = mount_point, right.split()[0]
    return fstype


def set_child_subreaper():
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise BenchError("prctl(PR_SET_CHILD_SUBREAPER): %s" % os.strerror(ctypes.get_errno()))


def parse_utc(text):
    """Seconds since the epoch from the receipt's 2026-11-30T14:17:48.020105Z."""
    moment = datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ")
    return moment.replace(tzinfo=datetime.timezone.utc).timestamp()


def is_venv_python(path):
    """Is path a venv's interpreter (a pyvenv.cfg beside it or one level
    up)? Run by that path: resolved to its binary it would lose the venv."""
    here = os.path.dirname(os.path.abspath(path))
    return any(os.path.exists(os.path.join(d, "pyvenv.cfg")) for d in (here, os.path.dirname(here)))


def resolve_python(path):
    """The interpreter to run: path itself where it is a venv's, else the
    real binary behind it; pyenv shims and scripts are refused."""
    real = os.path.realpath(path)
    if "/shims/" in real or "/shims/" in path:
        raise BenchError("%s is a pyenv shim; pass the real binary, e.g. "
                         "--python $(pyenv which python3)" % path)
    try:
        with open(real, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise BenchError("--python %s: %s" % (path, e.strerror))
    if magic[:2] == b"#!":
        raise BenchError("%s is a script (a shim or wrapper), not an interpreter binary" % real)
    if magic != b"\x7fELF" or not os.access(real, os.X_OK):
        raise BenchError("%s is not an executable ELF interpreter binary" % real)
    return os.path.abspath(path) if is_venv_python(path) else real


def site_check(py):
    """What site does in `py -I` beyond `py -I -S`: {"clean", "why" (a list
    of short reasons), "version", "cache_tag", "site_dirs", "pth",
    "extra_modules", "extra_path", "prefix", "base_prefix"}. Clean: no .pth
    in a site directory, nothing imported beyond the bare set (SITE_PROBE:
    what site itself imports without a site directory), nothing on sys.path
    beyond the site directories (a .pth's lines). A site directory without
    a .pth may be on sys.path: it costs nothing until an import misses the
    standard library."""
    found = {}
    for flags in (["-I"], ["-I", "-S"]):
        done = subprocess.run([py] + flags + ["-c", SITE_PROBE], stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if done.returncode != 0:
            raise BenchError("%s %s could not run the site check: %s" % (
                py, " ".join(flags), done.stderr.decode("utf-8", "replace").strip()[-200:]))
        found[len(flags)] = json.loads(done.stdout.decode())
    full, bare = found[1], found[2]
    extra_modules = sorted(set(full["modules"]) - set(bare["modules"]))
    extra_path = [d for d in full["path"] if d not in bare["path"] and d not in full["site_dirs"]]
    why = []
    if full["pth"]:
        why.append("its site loads %s" % ", ".join(full["pth"]))
    if extra_modules:
        why.append("imports %d module(s) beyond the bare set (%s%s)" % (
            len(extra_modules), ", ".join(extra_modules[:6]), ", ..." if extra_modules[6:] else ""))
    if extra_path:
        why.append("puts %s on sys.path" % ", ".join(extra_path))
    return {"clean": not why, "why": why, "version": ".".join(map(str, full["version"])),
            "version_info": full["version"], "cache_tag": full["cache_tag"],
            "site_dirs": full["site_dirs"], "pth": full["pth"], "extra_modules": extra_modules,
            "extra_path": extra_path, "prefix": full["prefix"], "base_prefix": full["base_prefix"]}


def make_venv(base, directory, keep_site=False):
    """A venv of base at directory, without pip: (its python3, its
    site-packages). Without keep_site its site-packages is removed (a
    venv's is empty), so its site adds nothing at all."""
    done = subprocess.run([base, "-I", "-m", "venv", "--without-pip", directory],
                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise BenchError("%s -m venv %s failed: %s" % (
            base, directory, done.stdout.decode("utf-8", "replace").strip()[-200:]))
    python = os.path.join(directory, "bin", "python3")
    site = subprocess.run([python, "-I", "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], stdout=subprocess.PIPE, check=True)
    site = site.stdout.decode().strip()
    if not keep_site and os.path.isdir(site):
        shutil.rmtree(site)
    return python, site


def choose_python(given, scratch):
    """The interpreter of every row, and how it was chosen: (path, its
    site_check, how). Given, it must be clean (else a one-line refusal).
    Else the first clean one of PYTHON_CANDIDATES and the bench's own;
    else the first of them whose venv (made under scratch, site-packages
    removed) is clean."""
    if given:
        py = resolve_python(given)
        check = site_check(py)
        if not check["clean"]:
            raise BenchError("--python %s is not clean: %s; give one whose site loads no .pth "
                             "(or omit --python: the bench makes a venv without site-packages)"
                             % (given, "; ".join(check["why"])))
        return py, check, "given (--python)"
    candidates, seen = [], set()
    for path in list(PYTHON_CANDIDATES) + [sys.executable]:
        try:
            py = resolve_python(path) if os.path.exists(path) else None
        except BenchError:
            py = None
        if py is not None and os.path.realpath(py) not in seen:
            seen.add(os.path.realpath(py))
            candidates.append(py)
    if not candidates:
        raise BenchError("no interpreter found: give one with --python PATH")
    refused = []
    for py in candidates:
        check = site_check(py)
        if check["clean"]:
            return py, check, "found: its site loads no .pth"
        refused.append("%s (%s)" % (py, "; ".join(check["why"])))
    for k, base in enumerate(candidates):
        venv, _ = make_venv(os.path.realpath(base), os.path.join(scratch, "clean-%d" % k))
        check = site_check(venv)
        if check["clean"]:
            return venv, check, ("made: a venv of %s without site-packages, as none here loads "
                                 "no .pth: %s" % (os.path.realpath(base), ", ".join(refused)))
        refused.append("a venv of %s (%s)" % (base, "; ".join(check["why"])))
    raise BenchError("no clean interpreter here (every one's site loads a .pth or more): %s"
                     % "; ".join(refused))


# --- The bench -------------------------------------------------------------------------------

class Bench(object):

    def __init__(self, py, pairs, pairs_big, quick, nemo=None, pyz=None, scratch=None):
        self.py, self.pairs, self.pairs_big, self.quick = py, pairs, pairs_big, quick
        self.nemo = nemo        # P0/P16's baseline: NeMo Gym's process_supervisor.py
        self.pyz = pyz          # P0: treereap.pyz (None: built into the temporary directory)
        self.scratch = scratch  # where the interpreter's venvs are made
        self.pym = None         # P0-module: a venv of PY with supervisor.py in its site-packages
        self.python_check = {}  # site_check() of PY (main sets it)
        self.load, self.row_start = [], time.monotonic()  # /proc/loadavg samples; the row's start
        self.section, self.stderr_logs = None, []  # the runs' stderr, a file per section
        self.window = 5.0 if quick else IDLE_WINDOW
        self.idle_count = 10 if quick else 30
        self.rows, self.notes = [], []
        # Figures later rows compare with (P9 with P4, P5 and P8).
        self.results = {"P4": float("nan"), "P5": (float("nan"), float("nan")), "P8": float("nan")}
        self.keep = set()       # long-lived children (P9 sleeps, P12 loops): never reaped by sweeps
        self.host_pids = set()  # the P9/P11 sleeps
        self.host_group = None  # pgid of the P9 sleeps (its leader is our unreaped child)
        self.loop_pids = set()  # the P12 busy loops
        self.loop_group = None  # their pgid (its leader is our unreaped child)
        self.cov_dir = None     # COV's data files, mode 1777, outside self.tmp (0700)
        self.env = dict(os.environ)  # the environment of every run
        self.seen = {}          # tag -> the containments the receipts of its runs gave
        self.default_containment = None   # what --containment auto chose in the probe
        self.cgroup_why_not = {}          # in a PID namespace or not -> why no cgroup, or None
        self.ns_prefix, self.ns_why_not = None, "not probed"   # P12/P13's PID namespace
        self.me = os.getpid()
        self.tmp = tempfile.mkdtemp(prefix="supervisor-bench-")
        self.work = self._mkdir("work")            # the supervisor's --workdir
        self.receipts = self._mkdir("receipts")    # outside the workdir
        self.stops = self._mkdir("stop")
        self.out = self._mkdir("out")
        self.tree = self._write("tree.py", TREE_HELPER)
        self.sigwait = self._write("sigwait.py", SIGWAIT_HELPER)
        self.fanout = self._write("fanout.py", FANOUT_HELPER)
        self.devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        self.stderr_fd = None
        self.set_section("start")
        self.run_id = 0
        self.density_n, self.density_rounds = DENSITY_N, 1  # P18 (main sets them)

    def _mkdir(self, name):
        path = os.path.join(self.tmp, name)
        os.mkdir(path)
        return path

    def _write(self, name, text):
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    # -- Processes ------------------------------------------------------------------------

    def spawn(self, argv, stdout=None, pgroup=None, env=None, stdin=None):
        """posix_spawn argv (argv[0] a path or found on PATH); stdin and stdout
        from the fds given or /dev/null, stderr to the section's log; the
        bench's environment unless env is given."""
        self.sample_load()
        path = argv[0] if os.sep in argv[0] else shutil.which(argv[0])
        actions = [(os.POSIX_SPAWN_DUP2, self.devnull if stdin is None else stdin, 0),
                   (os.POSIX_SPAWN_DUP2, self.devnull if stdout is None else stdout, 1),
                   (os.POSIX_SPAWN_DUP2, self.stderr_fd, 2)]
        kwargs = {"file_actions": actions}
        if pgroup is not None:
            kwargs["setpgroup"] = pgroup
        return os.posix_spawn(path, argv, self.env if env is None else env, **kwargs)

    def timed_run(self, argv, env=None):
        """Wall seconds of one whole process, and its wait status."""
        t0 = time.perf_counter()
        pid = self.spawn(argv, env=env)
        _, status = os.waitpid(pid, 0)
        return time.perf_counter() - t0, status

    def children(self):
        text = read_text("/proc/%d/task/%d/children" % (self.me, self.me)) or ""
        return set(int(pid) for pid in text.split())

    def sweep(self, context, expected=False, grace=2.0):
        """Reap every child that is not long-lived; SIGKILL (by pid: our own
        unreaped children) what is still alive after grace. Anything found
        after a supervisor run is noted: it should have drained it."""
        found, deadline = 0, time.monotonic() + grace
        while True:
            while True:
                try:
                    pid, _ = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    pid = 0
                if not pid:
                    break
                if pid in self.keep:
                    self.lost(pid, context)
                else:
                    found += 1
            alive = self.children() - self.keep
            if not alive:
                break
            if time.monotonic() >= deadline:
                for pid in alive:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            time.sleep(0.002)
        if found and not expected:
            self.note("%s: %d process(es) were left to the bench after the run" % (context, found))
        return found

    def lost(self, pid, context):
        """A long-lived child died (and was reaped) before the bench ended it."""
        self.keep.discard(pid)
        kind = "a P12 busy loop" if pid in self.loop_pids else "a host sleep"
        self.host_pids.discard(pid)
        self.loop_pids.discard(pid)
        self.note("%s %d died during %s" % (kind, pid, context))

    def supervisor(self, options, command, receipt=True):
        """argv of one supervisor run, with its own receipt path."""
        self.run_id += 1
        argv = [self.py, SUPERVISOR] + list(options)
        path = None
        if receipt:
            path = os.path.join(self.receipts, "r%d.json" % self.run_id)
            argv += ["--workdir", self.work, "--receipt", path]
        return argv + ["--"] + list(command), path

    def check_receipt(self, path, context, tag=None, **expected):
        """Read (and delete) a receipt; note any field that is not as expected
        (a tuple: one of those). With tag, its containment is noted under it."""
        try:
            with open(path) as f:
                receipt = json.load(f)
        except (OSError, ValueError) as e:
            self.note("%s: no readable receipt (%s)" % (context, e))
            return None
        os.unlink(path)
        expected.setdefault("cleanup_confirmed", True)
        for key, value in expected.items():
            if receipt.get(key) not in (value if isinstance(value, tuple) else (value,)):
                self.note("%s: receipt %s = %r, expected %s" % (
                    context, key, receipt.get(key),
                    " or ".join(map(repr, value)) if isinstance(value, tuple) else repr(value)))
        if tag is not None:
            self.seen.setdefault(tag, set()).add(receipt.get("containment"))
        return receipt

    def contained(self, tag):
        """' [cgroup]': the containment(s) the receipts under tag gave, for a
        row's text; rows without receipts say what the probe's auto chose."""
        names = sorted(str(c) for c in self.seen.get(tag, ())) if tag else []
        if not names:
            names = [self.default_containment or "?"]
        return " [%s]" % "+".join(names)

    @staticmethod
    def containment_options(containment):
        """The supervisor's options for a containment, as its receipt names
        it: None the default (auto), "cgroup", or "children" (the /proc walk,
        --containment proc)."""
        if containment is None:
            return []
        return ["--containment", "cgroup" if containment == "cgroup" else "proc"]

    # -- Sections: the load and the stderr of each row --------------------------------------

    def begin(self, text, section=None):
        """Measurements start: their progress line; from now on the load
        samples are the next row's (rows made of the same runs share them),
        and the runs' stderr goes to the section's own file (section: the
        text's first word)."""
        progress(text)
        self.set_section(section or text.split()[0])
        self.row_start = time.monotonic()
        self.sample_load(force=True)

    def set_section(self, name):
        if name == self.section:
            return
        path = os.path.join(self.tmp, "stderr-%02d-%s.log" % (len(self.stderr_logs), name))
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        if self.stderr_fd is not None:
            os.close(self.stderr_fd)
        self.section, self.stderr_fd = name, fd
        self.stderr_logs.append((name, path))

    def sample_load(self, force=False):
        """A /proc/loadavg sample (monotonic time, load1, load5, runnable
        now), at most every LOAD_EVERY s unless forced."""
        now = time.monotonic()
        if not force and self.load and now - self.load[-1][0] < LOAD_EVERY:
            return
        fields = (read_text("/proc/loadavg") or "nan nan nan 0/0").split()
        self.load.append((now, float(fields[0]), float(fields[1]), int(fields[3].split("/")[0])))

    def row_load(self):
        """The load while the row's runs ran: its samples since begin()."""
        self.sample_load(force=True)
        window = [x for x in self.load if x[0] >= self.row_start] or self.load[-1:]
        load1 = [x[1] for x in window]
        return {"load1_start": load1[0], "load1_end": load1[-1], "load1_min": min(load1),
                "load1_max": max(load1), "load5_end": window[-1][2],
                "runnable_median": median([x[3] for x in window]), "samples": len(window),
                "seconds": round(window[-1][0] - self.row_start, 1)}

    def note(self, text):
        if text not in self.notes:
            self.notes.append(text)
            progress("  note: " + text)

    # -- Rows -----------------------------------------------------------------------------

    def add_row(self, row, what, samples, unit, target, value, limit=None, yard=None,
                yard_median=None, diff=None, diff_text=None, extra=None, passed=None):
        """Record a row. value is what the target checks against limit (None:
        info only); passed, when given, is the verdict of a target that is not
        a simple bound."""
        yard_median = median(yard) if yard_median is None and yard else yard_median
        if diff is None and yard_median is not None:
            diff = median(samples) - yard_median
        if passed is None and limit is not None:
            passed = value <= limit
        result = "INFO" if passed is None else ("PASS" if passed else "MISS")
        entry = {
            "row": row, "what": what, "n": len(samples), "unit": unit,
            "median": median(samples), "min": min(samples), "max": max(samples),
            "yardstick_median": yard_median, "diff": diff, "diff_text": diff_text,
            "value": value, "target": target, "limit": limit, "result": result,
            "samples": [round(s, 4) for s in samples],
            "yardstick_samples": [round(s, 4) for s in yard] if yard else None,
            "load": self.row_load(),
        }
        entry.update(extra or {})
        self.rows.append(entry)
        progress("  %s %s: median %.3f %s -> %s (load %.2f-%.2f)" % (
            row, what, entry["median"], unit, result, entry["load"]["load1_min"],
            entry["load"]["load1_max"]))
        return entry

    def paired(self, run_a, run_b, count):
        """Interleave count pairs (after one warm-up pair) of two measurements,
        alternating which goes first; the two lists of results."""
        a, b = [], []
        for i in range(count + 1):
            self.sample_load()
            first, second = (run_a, run_b) if i % 2 == 0 else (run_b, run_a)
            x, y = first(), second()
            if i == 0:
                continue  # warm-up
            if i % 2 == 0:
                a.append(x)
                b.append(y)
            else:
                a.append(y)
                b.append(x)
        return a, b

    def module_env(self):
        """The environment for `PY -m supervisor`: its directory (the copy's)
        first on sys.path, and bytecode written to __pycache__ (the first run
        caches it)."""
        env = dict((k, v) for k, v in self.env.items() if k != "PYTHONDONTWRITEBYTECODE")
        env["PYTHONPATH"] = os.path.dirname(SUPERVISOR)
        return env

    def wall_pairs(self, argv_a, argv_b, expect_a=0, expect_b=0, env_a=None):
        """Wall ms of two commands, interleaved; their exit statuses checked."""
        def runner(argv, expect, env=None):
            def run():
                seconds, status = self.timed_run(argv, env)
                if exit_code(status) != expect:
                    self.note("%s exited %d, expected %d" % (
                        " ".join(argv[-3:]), exit_code(status), expect))
                return seconds * 1000
            return run
        return self.paired(runner(argv_a, expect_a, env_a), runner(argv_b, expect_b), self.pairs)

    # P0 ---------------------------------------------------------------------------------------

    def timed_by_time(self, argv, cwd):
        """One run of argv under /usr/bin/time, a parent smaller than either
        side (a child's peak RSS starts at its parent's at the fork): (CPU
        seconds of it and all it reaped, from wait4; its peak RSS in KiB, as
        time's wait4 of it saw it; exit status)."""
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.chdir(cwd)
                os.dup2(self.devnull, 0)
                os.dup2(self.devnull, 1)
                os.dup2(write_end, 2)
                os.execve(TIME, [TIME, "-f", "peak %M"] + argv, self.env)
            finally:
                os._exit(127)
        os.close(write_end)
        _, status, usage = os.wait4(pid, 0)
        with os.fdopen(read_end, "rb") as f:
            lines = f.read().decode("utf-8", "replace").splitlines()
        peak = [int(line.split()[1]) for line in lines if line.startswith("peak ")]
        if not peak:
            raise BenchError("P0: /usr/bin/time said no peak RSS: %s" % " | ".join(lines[-3:]))
        return usage.ru_utime + usage.ru_stime, peak[-1], exit_code(status)

    def p0_lean_core(self):
        """P0: code lines; then the start-up as the controller runs it, three
        ways, each beside NeMo Gym's script (see the docstring)."""
        lines = code_lines(SUPERVISOR)
        self.begin("P0-lines code lines")
        self.add_row("P0-lines", "code lines of supervisor.py (codelines.py's count)", [lines],
                     "lines", "<= 3250", lines, 3250.0)
        if self.nemo is None:
            self.note("P0: no --nemo PATH (NeMo Gym's process_supervisor.py): no side by side")
            return
        if not os.access(TIME, os.X_OK):
            raise BenchError("P0 needs GNU time at %s (apt-get install time)" % TIME)
        count = max(20, self.pairs)
        nemo = self.copy_as("p0-nemo", self.nemo)
        ours = self.copy_as("p0-script", SUPERVISOR)
        pyz = self.pyz_path()
        pym = self.module_python()
        self.begin("P0-site the interpreter's site, %d pairs" % count, "P0")
        site, bare = self.paired(self.p0_runner([self.py, "-I", "-c", "pass"], None),
                                 self.p0_runner([self.py, "-I", "-S", "-c", "pass"], None), count)
        self.add_row("P0-site", "PY -I -c pass over PY -I -S -c pass (what site costs here)",
                     [x[0] for x in site], "ms CPU", "info", None, yard=[x[0] for x in bare],
                     extra={"rss_mib": median([x[1] for x in site]),
                            "yardstick_rss_mib": median([x[1] for x in bare])})
        for way, py, prefix, how in (
                ("script", self.py, [self.py, "-I", ours], "PY -I process_supervisor.py (a copy)"),
                ("module", pym, [pym, "-I", "-m", MODULE],
                 "PYM -I -m supervisor (bytecode cached; PYM: a venv of PY, supervisor.py in its "
                 "site-packages)"),
                ("pyz", self.py, [self.py, "-I", pyz], "PY -I treereap.pyz")):
            self.begin("P0-%s start-up: %s, %d pairs beside NeMo Gym's" % (way, how, count), "P0")
            a, b = self.paired(self.p0_runner(prefix, "p0-" + way),
                               self.p0_runner([py, "-I", nemo], "p0-nemo"), count)
            for key, measure, unit in ((0, "cpu", "ms CPU"), (1, "rss", "MiB")):
                ours_x, theirs_x = [x[key] for x in a], [x[key] for x in b]
                ratio = median(ours_x) / median(theirs_x)
                limit = P0_LIMITS.get((way, measure))
                self.add_row("P0-%s-%s" % (way, measure), "start-up, %s, %s over NeMo Gym's "
                             "(%s -I process_supervisor.py): --timeout %s --receipt R -- true" % (
                                 how, "CPU" if measure == "cpu" else "peak RSS",
                                 "PYM" if py == pym and py != self.py else "PY", P0_TIMEOUT),
                             ours_x, unit, "ratio <= %g" % limit if limit else "info (ratio)",
                             ratio if limit else None, limit, yard=theirs_x, diff=ratio,
                             diff_text="ratio",
                             extra={"paired_ratio_median": median([x / y for x, y in
                                                                   zip(ours_x, theirs_x)]),
                                    "way": way, "python": py, "argv": prefix,
                                    "baseline": self.nemo})

    def copy_as(self, name, source):
        """source copied as process_supervisor.py into a folder of its own
        (NeMo Gym's name: ours as the drop-in it is), beside its receipt."""
        path = os.path.join(self._mkdir(name), "process_supervisor.py")
        shutil.copyfile(source, path)
        return path

    def p0_runner(self, prefix, name):
        """One P0 run of prefix under /usr/bin/time: (CPU ms, peak RSS MiB).
        With name, prefix is a supervisor, given `--timeout P0_TIMEOUT
        --receipt R -- true` with R in the folder name (made at the first
        run); its exit 0 and its receipt's cleanup_confirmed are checked,
        and R removed, so every run writes a new one."""
        receipt = None
        if name is not None:
            directory = os.path.join(self.tmp, name)
            if not os.path.isdir(directory):
                os.mkdir(directory)
            receipt = os.path.join(directory, "receipt.json")

        def run():
            argv = list(prefix)
            if receipt is not None:
                argv += ["--timeout", P0_TIMEOUT, "--receipt", receipt, "--", "true"]
            cpu, peak, status = self.timed_by_time(argv, cwd=self.work)
            if status != 0:
                self.note("P0: %s exited %d" % (" ".join(prefix[1:]), status))
            if receipt is not None:
                try:
                    with open(receipt) as f:
                        confirmed = json.load(f).get("cleanup_confirmed")
                    os.unlink(receipt)
                except (OSError, ValueError) as e:
                    confirmed = "no receipt (%s)" % e
                if confirmed is not True:
                    self.note("P0: %s: cleanup_confirmed %s" % (" ".join(prefix[1:]), confirmed))
            return cpu * 1000, peak / 1024.0
        return run

    def pyz_path(self):
        """treereap.pyz: the one given (--pyz), which must hold this
        supervisor.py, or one built now by scripts/build_pyz.py into the
        temporary directory (every CPython 3.6-3.13 it finds). A note says
        when it holds no bytecode for PY (it then compiles the source)."""
        if self.pyz is None:
            self.pyz = os.path.join(self.tmp, "treereap.pyz")
            done = subprocess.run([sys.executable, BUILD_PYZ, "-o", self.pyz, "--source",
                                   SUPERVISOR], stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            if done.returncode != 0:
                raise BenchError("P0: scripts/build_pyz.py failed: %s" % done.stdout.decode(
                    "utf-8", "replace").strip()[-200:])
        else:
            done = subprocess.run([sys.executable, BUILD_PYZ, "--check", self.pyz, "--source",
                                   SUPERVISOR], stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            if done.returncode != 0:
                raise BenchError("--pyz %s does not hold this supervisor.py: build it again "
                                 "(python3 scripts/build_pyz.py -o %s)" % (self.pyz, self.pyz))
        import zipfile
        with zipfile.ZipFile(self.pyz) as z:
            build = z.read("BUILD.txt").decode("utf-8", "replace")
            names = z.namelist()
        tag = self.python_check["cache_tag"]
        wanted = "treereap_%s.pyc" % tag.split("-")[-1]
        if wanted not in names:
            self.note("P0: %s holds no %s: on this interpreter it compiles supervisor.py at "
                      "every start" % (self.pyz, wanted))
        self.pyz_build = build
        return self.pyz

    def module_python(self):
        """PYM, for P0-module: a venv of PY's binary whose site-packages holds
        supervisor.py and its bytecode (compiled now, as an install does), and
        nothing else; checked as PY was, but for that directory on sys.path."""
        if self.pym is None:
            python, site = make_venv(os.path.realpath(self.py), os.path.join(self.tmp, "pym"),
                                     keep_site=True)
            if not os.path.isdir(site):
                os.makedirs(site)
            target = os.path.join(site, MODULE + ".py")
            shutil.copyfile(SUPERVISOR, target)
            subprocess.run([python, "-I", "-c", "import py_compile, sys; "
                            "py_compile.compile(sys.argv[1], doraise=True)", target], check=True)
            check = site_check(python)
            if not check["clean"]:
                raise BenchError("P0: the module row's venv %s is not clean: %s"
                                 % (python, "; ".join(check["why"])))
            self.pym = python
        return self.pym

    # P1 ---------------------------------------------------------------------------------------

    def p1_startup(self):
        self.begin("P1 startup")
        diffs = {}
        for flags, row, limit, bare in (([], "P1", 15.0, "PY -c pass"),
                                        (["-I", "-S"], "P1-IS", 25.0, "PY -I -S -c pass")):
            self.begin("%s startup %s" % (row, " ".join(flags)), "P1")
            sup = [self.py] + flags + [SUPERVISOR, "--timeout", "600", "--", "true"]
            sup_ms, bare_ms = self.wall_pairs(sup, [self.py] + flags + ["-c", "pass"])
            diff = median(sup_ms) - median(bare_ms)
            diffs[row] = diff
            self.add_row(row, "startup %s-- true, over %s%s" % (
                         " ".join(flags) + " " if flags else "", bare, self.contained(None)),
                         sup_ms, "ms", "diff <= %g ms" % limit, diff, limit, yard=bare_ms,
                         extra={"paired_diff_median": median([s - b for s, b in zip(sup_ms, bare_ms)])})
        self.begin("P1c compile supervisor.py", "P1")
        self.p1_compile_share(diffs)
        self.begin("P1-m startup -m supervisor", "P1")
        sup = [self.py, "-m", MODULE, "--timeout", "600", "--", "true"]
        sup_ms, bare_ms = self.wall_pairs(sup, [self.py, "-c", "pass"], env_a=self.module_env())
        diff = median(sup_ms) - median(bare_ms)
        self.add_row("P1-m", "startup -m supervisor -- true (cached bytecode), over PY -c pass%s"
                     % self.contained(None), sup_ms, "ms", "diff <= 15 ms", diff, 15.0,
                     yard=bare_ms)
        true = shutil.which("true")
        for name, prefix in reference_tools():
            self.begin("P1-ref %s" % name, "P1")
            tool_ms, true_ms = self.wall_pairs(prefix + [true], [true])
            self.add_row("P1-ref", "%s true, over bare true" % " ".join([name] + prefix[1:]),
                         tool_ms, "ms", "reference", None, yard=true_ms)

    def p1_compile_share(self, diffs):
        """P1c: how much of the P1 difference is compiling supervisor.py, which
        Python does from source on every start (no .pyc for __main__)."""
        with open(SUPERVISOR, "rb") as f:
            source = f.read()
        lines = len(source.splitlines())
        # Timed in PY itself (the first one warms up and is dropped).
        done = subprocess.run([self.py, "-I", "-S", "-c", COMPILE_TIMER, SUPERVISOR,
                               str(COMPILE_REPEATS + 1)], stdout=subprocess.PIPE, check=True)
        times = [float(x) for x in done.stdout.split()][1:]
        bench_py = self.py
        share = median(times) / diffs["P1"] if diffs["P1"] > 0 else float("nan")
        share_is = median(times) / diffs["P1-IS"] if diffs["P1-IS"] > 0 else float("nan")
        self.add_row("P1c", "compile supervisor.py (%d lines): share of the P1 diff" % lines,
                     times, "ms", "info (share of P1 diff)", None, yard_median=diffs["P1"],
                     diff=share, diff_text="share",
                     extra={"compile_ms_median": median(times), "compile_ms_min": min(times),
                            "p1_diff_ms": diffs["P1"], "compile_share_of_p1_diff": share,
                            "p1_is_diff_ms": diffs["P1-IS"], "compile_share_of_p1_is_diff": share_is,
                            "supervisor_lines": lines, "supervisor_bytes": len(source),
                            "compile_python": bench_py,
                            "yardstick_note": "the P1 diff (median startup minus median "
                                              "PY -c pass), same run"})

    # P2 ---------------------------------------------------------------------------------------

    def p2_exit(self):
        self.begin("P2 command exit -> supervisor exit")
        sup = [self.py, SUPERVISOR, "--timeout", "600", "--"]
        self._p2_row("P2", "exit -> exit: sup -- sleep 0.2 minus -- true minus 200 ms%s"
                     % self.contained(None),
                     sup, "diff <= 2 ms", 2.0)
        for name, prefix in reference_tools():
            self.begin("P2-ref %s" % name, "P2")
            self._p2_row("P2-ref", "%s sleep 0.2 minus %s true minus 200 ms" % (name, name),
                         prefix, "reference", None)
        self.begin("P2b exit -> exit, direct", "P2")
        self.p2_direct()

    def _p2_row(self, row, what, prefix, target, limit):
        sleep_ms, true_ms = self.wall_pairs(prefix + ["sleep", "0.2"], prefix + ["true"])
        value = median(sleep_ms) - median(true_ms) - 200.0
        per_pair = [s - t - 200.0 for s, t in zip(sleep_ms, true_ms)]
        self.add_row(row, what, sleep_ms, "ms", target, value if limit else None, limit,
                     yard=true_ms, diff=value, diff_text="sleep-true-200",
                     extra={"per_pair_diff_ms": [round(x, 4) for x in per_pair],
                            "per_pair_diff_median": median(per_pair),
                            "yardstick_note": "yardstick = the -- true runs"})

    def p2_direct(self):
        """P2b: the command stamps time.monotonic() just before it exits."""
        command = [self.py, "-I", "-S", "-c", EXIT_STAMP]

        def measure(argv):
            def run():
                read_end, write_end = os.pipe()
                try:
                    pid = self.spawn(argv, stdout=write_end)
                    os.close(write_end)
                    write_end = None
                    os.waitpid(pid, 0)
                    ended = time.monotonic()
                    stamp = os.read(read_end, 100)
                finally:
                    os.close(read_end)
                    if write_end is not None:
                        os.close(write_end)
                return (ended - float(stamp)) * 1000
            return run

        sup_argv = [self.py, SUPERVISOR, "--timeout", "600", "--"] + command
        sup_ms, bare_ms = self.paired(measure(sup_argv), measure(command), self.pairs)
        diff = median(sup_ms) - median(bare_ms)
        self.add_row("P2b", "exit -> exit, direct: command's last stamp -> supervisor reaped%s"
                     % self.contained(None),
                     sup_ms, "ms", "diff <= 2 ms (alt. method)", diff, 2.0, yard=bare_ms,
                     extra={"yardstick_note": "the same command run by the bench"})

    # P3 / P4 ----------------------------------------------------------------------------------

    # P15 ---------------------------------------------------------------------------------------

    def p15_limits(self):
        """P15: what limits cost, limited against unlimited, interleaved:
        start-up (`-- true`) and a deadline stop of a two-process tree. The
        limits this machine enforces: --cpu-time with a cgroup, --max-output
        everywhere, --memory-max and --pids-max where cgroup v2 has their
        controllers (in the guest: tests/guest/vmrun.sh 'python3
        scripts/bench.py --only P15')."""
        self.begin("P15 limits")
        limits = ["--output", os.path.join(self.out, "p15.log"), "--max-output", "1M"]
        for more in (["--cpu-time", "600"], ["--memory-max", "1G", "--pids-max", "1000"]):
            probe = [self.py, SUPERVISOR, "--timeout", "60"] + limits + more + ["--", "true"]
            if exit_code(self.timed_run(probe)[1]) == 0:
                limits += more
        named = " ".join(a for a in limits if a.startswith("--") and a != "--output")
        for row, tail, expect in (
                ("P15", ["--timeout", "600", "--", "true"], 0),
                ("P15s", ["--timeout", "0.3", "-k", "5", "--", "sh", "-c",
                          "sleep 100 & sleep 100"], 124)):
            plain = [self.py, SUPERVISOR] + tail
            self.begin("%s with limits, over without" % row, "P15")
            limited_ms, plain_ms = self.wall_pairs(plain[:2] + limits + tail, plain, expect, expect)
            diff = median(limited_ms) - median(plain_ms)
            self.add_row(row, "%s with %s, over without%s" % (
                "startup -- true" if row == "P15" else "a deadline stop (0.3 s) of 2 processes",
                named, self.contained(None)), limited_ms, "ms", "diff <= 15 ms", diff, 15.0,
                yard=plain_ms)
            self.sweep(row)

    def p3_deadline(self):
        self.begin("P3 deadline -> SIGTERM")
        latencies, woke = [], []
        for i in range(self.pairs + 1):
            stamp = os.path.join(self.out, "p3-%d" % i)
            argv, receipt_path = self.supervisor(
                ["--timeout", str(P3_TIMEOUT)], [self.py, "-I", "-S", self.sigwait, stamp])
            pid = self.spawn(argv)
            os.waitpid(pid, 0)
            receipt = self.check_receipt(receipt_path, "P3", tag="P3", stop_reason="timeout",
                                         exit_status=124)
            arrival = read_text(stamp)
            self.sweep("P3")
            if receipt is None or arrival is None:
                self.note("P3: run %d gave no receipt or no arrival stamp" % i)
                continue
            os.unlink(stamp)
            deadline = parse_utc(receipt["started_at"]) + P3_TIMEOUT
            if i:
                latencies.append((float(arrival.split()[0]) - deadline) * 1000)
                if receipt.get("ladder"):  # when its loop woke up, by its own clock
                    woke.append((receipt["ladder"][0]["start_s"] - P3_TIMEOUT) * 1000)
        self.add_row("P3", "deadline -> first SIGTERM (arrival)%s" % self.contained("P3"),
                     latencies, "ms",
                     "median <= 2 ms", median(latencies), 2.0, yard_median=0.0,
                     extra={"yardstick_note": "the deadline: receipt started_at + %g s" % P3_TIMEOUT,
                            "wake_late_ms_median": median(woke),
                            "wake_late_note": "receipt ladder[0].start_s - timeout: how late the "
                                              "supervisor's wait returned, by its monotonic clock"})

    def stop_file_latencies(self, count, context):
        """count stop-file runs (after a warm-up): ms from the stop file to the
        first SIGTERM, and ms from the stop file to the supervisor's exit."""
        latencies, exits = [], []
        for i in range(count + 1):
            stamp = os.path.join(self.out, "p4-%d" % i)
            stop = os.path.join(self.stops, "p4-stop")
            argv, receipt_path = self.supervisor(
                ["--timeout", "60", "--stop-file", stop],
                [self.py, "-I", "-S", self.sigwait, stamp, "ready"])
            read_end, write_end = os.pipe()
            try:
                pid = self.spawn(argv, stdout=write_end)
                os.close(write_end)
                write_end = None
                read_ready(read_end, context + " helper")
                created = time.monotonic()
                os.close(os.open(stop, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644))
                os.waitpid(pid, 0)
                exited = time.monotonic()
            finally:
                os.close(read_end)
                if write_end is not None:
                    os.close(write_end)
            os.unlink(stop)
            self.check_receipt(receipt_path, context, tag=context, stop_reason="stop_file",
                               exit_status=124)
            arrival = read_text(stamp)
            self.sweep(context)
            if arrival is None:
                self.note("%s: run %d: the helper never saw SIGTERM" % (context, i))
                continue
            os.unlink(stamp)
            if i:
                latencies.append((float(arrival.split()[1]) - created) * 1000)
                exits.append((exited - created) * 1000)
        return latencies, exits

    def p4_stop_file(self):
        self.begin("P4 stop file -> SIGTERM")
        fstype = filesystem_of(self.stops)
        latencies, exits = self.stop_file_latencies(self.pairs, "P4")
        local = fstype not in ("nfs", "nfs4", "cifs", "smb3", "9p", "ceph", "fuse", "afs") \
            and not fstype.startswith("fuse")
        limit = 5.0 if local else 100.0
        self.add_row("P4", "stop file -> first SIGTERM (%s, %s)%s" % (
                         fstype, "local" if local else "remote", self.contained("P4")),
                     latencies, "ms", "median <= %g ms" % limit, median(latencies), limit,
                     yard_median=0.0, extra={"filesystem": fstype, "stop_dir": self.stops,
                                             "yardstick_note": "the stop file's creation time"})
        self.results["P4"] = median(latencies)
        self.add_row("P4b", "stop file -> supervisor exit (the helper exits at SIGTERM)%s"
                     % self.contained("P4"), exits,
                     "ms", "info", None, yard_median=0.0,
                     extra={"yardstick_note": "the stop file's creation time"})

    # P5 / P9 idle ------------------------------------------------------------------------------

    def idle_cpu(self, count, context):
        """count supervisors and count bare sleepers at once; their CPU ms and
        read+write syscalls per minute over the window."""
        sups, stops = [], []
        for i in range(count):
            directory = os.path.join(self.stops, "%s-%d" % (context, i))
            os.mkdir(directory)
            stop = os.path.join(directory, "stop")
            argv, _ = self.supervisor(["--timeout", "600", "--stop-file", stop],
                                      ["sleep", "60"], receipt=False)
            sups.append(self.spawn(argv))
            stops.append(stop)
        bares = [self.spawn([self.py, "-c", "import time; time.sleep(60)"]) for _ in range(count)]
        try:
            deadline = time.monotonic() + 30
            # Started: its lookout and its command, two children.
            while not all(len((read_text("/proc/%d/task/%d/children" % (p, p)) or "").split())
                          >= 2 for p in sups):
                if time.monotonic() > deadline:
                    raise BenchError("%s: supervisors did not start their commands" % context)
                time.sleep(0.05)
            time.sleep(1.0)  # settle
            # A supervisor's figures are its own plus its lookout's.
            everyone = [[p] + forks_of(p) for p in sups] + [[p] for p in bares]
            if any(len(team) != 2 for team in everyone[:count]):
                raise BenchError("%s: a supervisor without its one lookout" % context)

            def sample(measure):
                values = [[measure(p) for p in team] for team in everyone]
                return [None if None in v else sum(v) for v in values]
            cpu0, io0 = sample(schedstat_ns), sample(io_syscalls)
            t0 = time.monotonic()
            time.sleep(self.window)
            cpu1, io1 = sample(schedstat_ns), sample(io_syscalls)
            scale = 60.0 / (time.monotonic() - t0)
        finally:
            for stop in stops:
                os.close(os.open(stop, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
            for pid in bares:
                os.kill(pid, signal.SIGTERM)  # our unreaped child
            for pid in sups + bares:
                _, status = os.waitpid(pid, 0)
                if pid in sups and exit_code(status) != 124:
                    self.note("%s: a supervisor exited %d after its stop file, expected 124"
                              % (context, exit_code(status)))
            for stop in stops:
                os.unlink(stop)
                os.rmdir(os.path.dirname(stop))
            self.sweep(context)
        cpu = [(b - a) / 1e6 * scale for a, b in zip(cpu0, cpu1)]
        calls = [(b - a) * scale if a is not None and b is not None else float("nan")
                 for a, b in zip(io0, io1)]
        return cpu[:count], cpu[count:], calls[:count], calls[count:]

    def p5_idle(self):
        self.begin("P5 idle CPU (%d supervisors, %g s window)" % (self.idle_count, self.window))
        sup, bare, sup_calls, bare_calls = self.idle_cpu(self.idle_count, "P5")
        self.add_row("P5", "idle CPU: -- sleep 60, deadline + stop file%s" % self.contained(None),
                     sup, "ms/min",
                     "median <= 10 ms/min", median(sup), 10.0, yard=bare,
                     extra={"syscalls_per_min_median": median(sup_calls),
                            "yardstick_syscalls_per_min_median": median(bare_calls),
                            "window_s": self.window,
                            "yardstick_note": "PY -c 'import time; time.sleep(60)', same sampling"})
        self.results["P5"] = (median(sup), median(sup_calls))

    # P6 / P7 / P8 -----------------------------------------------------------------------------

    def drain_supervised(self, n, mode, prefix=None, containment=None, label="P6/P7", tag=None):
        """One forced stop under the supervisor (or, with prefix, under a
        reference tool): (ms from SIGTERM to its exit, its CPU ms meanwhile,
        ms from SIGTERM to the receipt's ended_at, i.e. supervise() returning,
        before the receipt is written and the interpreter exits). With
        containment ("cgroup" or "children", see containment_options) the
        supervisor is told which, and its receipt must say so; without, the
        default, whose receipt's containment is noted under tag."""
        options = self.containment_options(containment)
        expected = {} if containment is None else {"containment": containment}
        # drain-all: SIGTERM to every process; one that ignores it is SIGKILLed,
        # the command too, and then the exit status says so (as timeout(1)).
        status_wanted = 128 + (signal.SIGKILL if mode == "ignore" else signal.SIGTERM)
        if prefix is None:
            options += ["--timeout", "600"] + (["--cleanup-timeout", str(GRACE)] if mode == "ignore" else [])
            argv, receipt_path = self.supervisor(options, [self.py, "-I", "-S", self.tree, str(n), mode])
        else:
            argv, receipt_path = prefix + [self.py, "-I", "-S", self.tree, str(n), mode], None
        read_end, write_end = os.pipe()
        try:
            pid = self.spawn(argv, stdout=write_end)
            os.close(write_end)
            write_end = None
            read_ready(read_end, "tree helper N=%d" % n)
            cpu0 = schedstat_ns(pid)
            wall0, t0 = time.time(), time.perf_counter()
            os.kill(pid, signal.SIGTERM)
            wait_exited(pid)
            elapsed = time.perf_counter() - t0
            cpu = schedstat_ns(pid) - cpu0  # the zombie's figure: its own CPU only
            _, status = os.waitpid(pid, 0)
        finally:
            os.close(read_end)
            if write_end is not None:
                os.close(write_end)
        context = "N=%d %s%s%s" % (n, mode, "" if prefix is None else " " + prefix[0],
                                   "" if containment is None else " " + containment)
        returned = float("nan")
        if receipt_path is not None:
            receipt = self.check_receipt(receipt_path, label + " " + context, tag=tag,
                                         stop_reason="signal", exit_status=status_wanted,
                                         **expected)
            if receipt is not None:
                returned = (parse_utc(receipt["ended_at"]) - wall0) * 1000
            if exit_code(status) != status_wanted:
                self.note("%s: supervisor exited %d, expected %d"
                          % (context, exit_code(status), status_wanted))
        self.sweep(context, expected=prefix is not None)
        return elapsed * 1000, cpu / 1e6, returned

    def drain_floor(self, n, mode):
        """The yardstick: the bench starts the tree in a new group, killpg's it
        (SIGKILL after GRACE when it ignores SIGTERM) and reaps all n."""
        read_end, write_end = os.pipe()
        try:
            pid = self.spawn([self.py, "-I", "-S", self.tree, str(n), mode],
                             stdout=write_end, pgroup=0)
            os.close(write_end)
            write_end = None
            read_ready(read_end, "tree helper N=%d" % n)
            t0 = time.perf_counter()
            os.killpg(pid, signal.SIGTERM)  # the leader is our unreaped child
            if mode == "ignore":
                time.sleep(GRACE)
                os.killpg(pid, signal.SIGKILL)
            reaped = 0
            while reaped < n:
                child, _ = os.waitpid(-1, 0)
                if child in self.keep:
                    self.lost(child, "the yardstick")
                else:
                    reaped += 1
            elapsed = time.perf_counter() - t0
        finally:
            os.close(read_end)
            if write_end is not None:
                os.close(write_end)
        self.sweep("yardstick N=%d" % n)
        return elapsed * 1000

    def p6_p7_drains(self):
        targets = {10: 10.0, 100: 25.0, 1000: 150.0}
        for mode, row in (("obey", "P6"), ("ignore", "P7")):
            for n, limit in sorted(targets.items()):
                count = self.pairs if n < 1000 else self.pairs_big
                self.begin("%s forced stop N=%d (%s SIGTERM), %d pairs" % (row, n, mode, count))
                cpus, returns = [], []

                def measured():
                    ms, cpu, returned = self.drain_supervised(n, mode, tag=row)
                    cpus.append(cpu)
                    returns.append(returned)
                    return ms

                sup_ms, floor_ms = self.paired(measured, lambda: self.drain_floor(n, mode), count)
                cpus, returns = cpus[1:], returns[1:]  # drop the warm-up
                extra = {"supervisor_cpu_ms": [round(c, 4) for c in cpus],
                         "supervisor_cpu_ms_median": median(cpus),
                         "to_supervise_return_ms_median": median(returns),
                         "to_supervise_return_note": "SIGTERM -> receipt ended_at (wall clock): "
                                                     "the drain without receipt I/O and exit"}
                extra["containment"] = sorted(str(c) for c in self.seen.get(row, ()))
                if mode == "obey":
                    self.add_row(row, "forced stop, %d obey SIGTERM: SIGTERM -> exit%s"
                                 % (n, self.contained(row)),
                                 sup_ms, "ms", "median <= %g ms" % limit, median(sup_ms), limit,
                                 yard=floor_ms, extra=extra)
                else:
                    self.add_row(row, "forced stop, %d ignore SIGTERM (grace %g s)%s"
                                 % (n, GRACE, self.contained(row)),
                                 sup_ms, "ms", "median-grace <= %g ms" % limit,
                                 median(sup_ms) - GRACE * 1000, limit, yard=floor_ms,
                                 extra=dict(extra, median_minus_grace=median(sup_ms) - GRACE * 1000))
                if mode == "obey" and n == 1000:
                    self.add_row("P8", "CPU of a 1000-process drain (SIGTERM -> exit)%s"
                                 % self.contained(row), cpus, "ms CPU", "median <= 100 ms",
                                 median(cpus), 100.0, extra={"containment": extra["containment"]})
                    self.results["P8"] = median(cpus)
        for name, prefix in reference_tools():
            for n in sorted(targets):
                count = self.pairs if n < 1000 else self.pairs_big
                self.begin("P6-ref %s N=%d" % (name, n))
                ref_ms, floor_ms = self.paired(lambda: self.drain_supervised(n, "obey", prefix)[0],
                                               lambda: self.drain_floor(n, "obey"), count)
                self.add_row("P6-ref", "%s, %d obey SIGTERM: SIGTERM -> %s exit" % (name, n, name),
                             ref_ms, "ms", "reference (no drain)", None, yard=floor_ms)

    # P9 ---------------------------------------------------------------------------------------

    def start_busy_host(self, context="P9"):
        progress("%s starting %d unrelated sleeps" % (context, BUSY_HOST))
        sleep = shutil.which("sleep")
        leader = self.spawn([sleep, "600"], pgroup=0)
        self.keep.add(leader)
        self.host_pids.add(leader)
        self.host_group = leader
        for _ in range(BUSY_HOST - 1):
            pid = self.spawn([sleep, "600"], pgroup=leader)
            self.keep.add(pid)
            self.host_pids.add(pid)
        deadline = time.monotonic() + 60
        while True:  # all exec'd and asleep
            states = [read_text("/proc/%d/stat" % pid) or "" for pid in list(self.host_pids)[::50]]
            if all(") S " in s for s in states):
                break
            if time.monotonic() > deadline:
                raise BenchError("the %d sleeps did not settle" % BUSY_HOST)
            time.sleep(0.1)

    def stop_busy_host(self):
        self._end_group(self.host_group, self.host_pids)
        self.host_group = None

    def _end_group(self, group, pids):
        """SIGKILL one of our long-lived groups and reap its members (pids,
        emptied); its leader is still our unreaped child, so the id is ours."""
        if group is None:
            return
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for pid in list(pids):
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
            self.keep.discard(pid)
            pids.discard(pid)

    def start_loops(self):
        """P12 loaded: BUSY_LOOPS CPU-bound `PY -c "while 1: pass"` in a new
        process group of their own, beside the run (not in it)."""
        leader = self.spawn([self.py, "-c", BUSY_LOOP], pgroup=0)
        self.keep.add(leader)
        self.loop_pids.add(leader)
        self.loop_group = leader
        for _ in range(BUSY_LOOPS - 1):
            pid = self.spawn([self.py, "-c", BUSY_LOOP], pgroup=leader)
            self.keep.add(pid)
            self.loop_pids.add(pid)

    def stop_loops(self):
        self._end_group(self.loop_group, self.loop_pids)
        self.loop_group = None

    def p9_busy_host(self):
        self.start_busy_host()
        try:
            processes = sum(1 for name in os.listdir("/proc") if name.isdigit())
            self.begin("P9 idle CPU with %d processes on the host" % processes)
            count = max(10, self.idle_count * 2 // 3)
            sup, bare, sup_calls, _ = self.idle_cpu(count, "P9")
            quiet_cpu, quiet_calls = self.results["P5"]
            ratio = median(sup) / quiet_cpu if quiet_cpu else float("inf")
            # "No change (no /proc scans while waiting)": the syscall count is the
            # direct evidence (a scan of 5,000 processes is ~15,000 syscalls); the
            # CPU may wobble by a few ms/min between runs, but one scan costs
            # ~45 ms, so within 2x or +5 ms/min still rules out even one a minute.
            unchanged = (median(sup_calls) <= quiet_calls * 1.1 + 1
                         and (ratio <= 2 or median(sup) - quiet_cpu <= 5.0))
            self.add_row("P9a", "idle CPU with %d processes on the host%s"
                         % (processes, self.contained(None)), sup,
                         "ms/min", "syscalls +<=10%, CPU x<=2 or +<=5", ratio, None,
                         yard_median=quiet_cpu, diff=ratio, diff_text="ratio", passed=unchanged,
                         extra={"ratio": ratio, "syscalls_per_min_median": median(sup_calls),
                                "quiet_syscalls_per_min_median": quiet_calls,
                                "bare_cpu_ms_per_min_median": median(bare),
                                "host_processes": processes,
                                "yardstick_note": "P5's supervisors on the quiet host, same run"})
            self.begin("P9 drain CPU with %d processes, %d runs" % (processes, self.pairs_big))
            runs = [self.drain_supervised(1000, "obey", tag="P9b")
                    for _ in range(self.pairs_big + 1)][1:]
            cpus, walls = [r[1] for r in runs], [r[0] for r in runs]
            ratio = median(cpus) / self.results["P8"]
            self.add_row("P9b", "drain CPU, 1000 processes, %d on the host%s"
                         % (processes, self.contained("P9b")), cpus,
                         "ms CPU", "ratio to P8 <= 2", ratio, 2.0, yard_median=self.results["P8"],
                         diff=ratio, diff_text="ratio",
                         extra={"wall_ms": [round(w, 4) for w in walls], "wall_ms_median": median(walls),
                                "host_processes": processes})
            self.begin("P9c stop file latency with %d processes" % processes)
            latencies, _ = self.stop_file_latencies(max(5, self.pairs // 3), "P9c")
            self.add_row("P9c", "stop file -> SIGTERM with %d processes (info)%s"
                         % (processes, self.contained("P9c")),
                         latencies, "ms", "info (P4: <= 5 ms)", None,
                         yard_median=self.results["P4"], diff_text="vs quiet P4",
                         extra={"yardstick_note": "P4 on the quiet host, same run"})
        finally:
            self.stop_busy_host()

    # P10 --------------------------------------------------------------------------------------

    def peak_rss_triple(self):
        """One pair: the bare interpreter, `-- sleep 0.5` and a stopped
        N=1000 tree run at once, VmHWM sampled every ~1 ms. KiB each."""
        bare = self.spawn([self.py, "-c", "import time; time.sleep(1)"])
        small = self.spawn(self.supervisor(["--timeout", "600"], ["sleep", "0.5"], receipt=False)[0])
        argv, receipt_path = self.supervisor(
            ["--timeout", "600"], [self.py, "-I", "-S", self.tree, "1000", "obey"])
        read_end, write_end = os.pipe()
        try:
            big = self.spawn(argv, stdout=write_end)
            os.close(write_end)
            write_end = None
            pids = {"bare": bare, "small": small, "big": big}
            peak = dict((k, 0) for k in pids)
            left, stopped = set(pids), False
            deadline = time.monotonic() + READY_TIMEOUT
            while left:
                for key in list(left):
                    hwm = vmhwm_kib(pids[key])
                    if hwm is not None:
                        peak[key] = max(peak[key], hwm)
                    if has_exited(pids[key]):
                        left.discard(key)
                if not stopped:
                    poller = select.poll()
                    poller.register(read_end, select.POLLIN)
                    if poller.poll(0):
                        read_ready(read_end, "P10 tree helper")
                        os.kill(big, signal.SIGTERM)
                        stopped = True
                if time.monotonic() > deadline:
                    raise BenchError("P10: the runs did not end")
                time.sleep(0.001)
            for pid in pids.values():
                os.waitpid(pid, 0)
        finally:
            os.close(read_end)
            if write_end is not None:
                os.close(write_end)
        self.check_receipt(receipt_path, "P10", tag="P10b", stop_reason="signal")
        self.sweep("P10")
        return peak

    def p10_peak_rss(self):
        count = max(self.pairs_big, self.pairs * 2 // 3)
        self.begin("P10 peak RSS, %d triples" % count)
        triples = [self.peak_rss_triple() for _ in range(count + 1)][1:]
        mib = 1024.0
        bare = [t["bare"] / mib for t in triples]
        for key, what in (("small", "peak RSS, -- sleep 0.5"), ("big", "peak RSS, 1000-process drain")):
            values = [t[key] / mib for t in triples]
            diff = median(values) - median(bare)
            self.add_row("P10" + ("a" if key == "small" else "b"), what + ", over bare PY%s"
                         % self.contained("P10b" if key == "big" else None), values,
                         "MiB", "diff <= 5 MiB", diff, 5.0, yard=bare,
                         extra={"yardstick_note": "VmHWM of PY -c 'import time; time.sleep(1)'"})
        self.p10_idle_rss()

    def idle_rss_pair(self, supervisor_first, as_module=False):
        """P10c, one pair: the supervisor's `-- sleep 60` (as a script, or with
        as_module as `PY -m supervisor`) and the bare interpreter started side
        by side (in the given order); VmRSS of each (KiB) IDLE_RSS_SETTLE s
        after the supervisor's command runs."""
        sup_argv = self.supervisor(["--timeout", "600"], ["sleep", "60"], receipt=False)[0]
        if as_module:
            sup_argv = [self.py, "-m", MODULE] + sup_argv[2:]
        bare_argv = [self.py, "-c", "import time; time.sleep(60)"]
        pids = {}
        try:
            for key, argv in ((("sup", sup_argv), ("bare", bare_argv)) if supervisor_first
                              else (("bare", bare_argv), ("sup", sup_argv))):
                pids[key] = self.spawn(argv, env=self.module_env() if key == "sup" and as_module
                                       else None)
            sup = pids["sup"]
            deadline = time.monotonic() + READY_TIMEOUT
            while not read_text("/proc/%d/task/%d/children" % (sup, sup)):
                if has_exited(sup) or time.monotonic() > deadline:
                    raise BenchError("P10c: the supervisor did not start its command")
                time.sleep(0.005)
            time.sleep(IDLE_RSS_SETTLE)
            rss = dict((key, status_kib(pid, "VmRSS")) for key, pid in pids.items())
        finally:
            for key, pid in pids.items():
                try:
                    os.kill(pid, signal.SIGTERM)  # our unreaped child; the supervisor drains
                except ProcessLookupError:
                    pass
            for key, pid in pids.items():
                _, status = os.waitpid(pid, 0)
                if key == "sup" and exit_code(status) != 128 + signal.SIGTERM:
                    self.note("P10c: a supervisor exited %d at SIGTERM, expected %d"
                              % (exit_code(status), 128 + signal.SIGTERM))
            self.sweep("P10c")
        if None in rss.values():
            raise BenchError("P10c: no VmRSS in /proc/PID/status")
        return rss["sup"], rss["bare"]

    def p10_idle_rss(self):
        count = max(self.pairs_big, self.pairs // 2)
        # As a script the parse tree lives as long as the run: info only.
        for as_module, row, how, limit in ((False, "P10c", "PY supervisor.py", None),
                                           (True, "P10c-m", "PY -m supervisor", IDLE_RSS_LIMIT)):
            self.begin("%s idle RSS, %s, %d pairs" % (row, how, count), "P10")
            self._p10_idle_rss_row(count, as_module, row, how, limit)

    def _p10_idle_rss_row(self, count, as_module, row, how, limit):
        # One warm-up pair dropped; which side starts first alternates.
        pairs = [self.idle_rss_pair(i % 2 == 0, as_module) for i in range(count + 1)][1:]
        mib = 1024.0
        sup, bare = [p[0] / mib for p in pairs], [p[1] / mib for p in pairs]
        diff = median(sup) - median(bare)
        target = "info (script: parse tree kept)" if limit is None else "diff <= %g MiB" % limit
        self.add_row(row, "idle RSS, %s -- sleep 60 (VmRSS %g s after the command runs), "
                     "over bare PY%s" % (how, IDLE_RSS_SETTLE, self.contained(None)), sup, "MiB",
                     target, None if limit is None else diff, limit, yard=bare,
                     extra={"per_pair_diff_mib": [round(a - b, 4) for a, b in zip(sup, bare)],
                            "settle_s": IDLE_RSS_SETTLE,
                            "yardstick_note": "VmRSS of PY -c 'import time; time.sleep(60)' "
                                              "started beside it, read at the same moment"})

    # P11 --------------------------------------------------------------------------------------

    def p11_crowded_host(self):
        """The P6 N=100 stop on the quiet and on the crowded host, in blocks
        ordered ABBA (quiet, crowded | crowded, quiet | ...) so the 5,000
        sleeps start and stop once per two blocks; inside a block the
        containments (the walk, the cgroup) take turns, each going first in
        turn, and each block drops its first run of each."""
        rounds = 2 if self.quick else 6
        per_block = max(1, -(-self.pairs // rounds))  # ceil(pairs / rounds)
        kinds = ("children",)
        if self.cgroup_why_not.get(False) is None:
            kinds = ("children", "cgroup")
        else:
            self.note("P11: no cgroup rows: %s" % self.cgroup_why_not[False])
        self.begin("P11 forced stop N=%d, quiet vs %d more processes: %d blocks of %d runs each "
                 "of %s" % (CROWD_N, BUSY_HOST, 2 * rounds, per_block, ", ".join(kinds)))
        series = dict(((crowded, kind), {"ms": [], "cpu": []})
                      for crowded in (False, True) for kind in kinds)
        processes = {False: [], True: []}
        try:
            for r in range(rounds):
                for crowded in ((False, True) if r % 2 == 0 else (True, False)):
                    if crowded and self.host_group is None:
                        self.start_busy_host("P11")
                    elif not crowded and self.host_group is not None:
                        self.stop_busy_host()
                    processes[crowded].append(sum(1 for name in os.listdir("/proc") if name.isdigit()))
                    for i in range(per_block + 1):
                        for kind in kinds[i % len(kinds):] + kinds[:i % len(kinds)]:
                            ms, cpu, _ = self.drain_supervised(CROWD_N, "obey", containment=kind,
                                                               label="P11")
                            if i:  # the block's first run of each kind warms up
                                series[crowded, kind]["ms"].append(ms)
                                series[crowded, kind]["cpu"].append(cpu)
        finally:
            self.stop_busy_host()
        quiet, crowd = median(processes[False]), median(processes[True])
        for kind in kinds:
            suffix, name = {"children": ("", "walk (children)"), "cgroup": ("-cgroup", "cgroup")}[kind]
            for key, letter, unit, what in (("cpu", "a", "ms CPU", "CPU of a %d-process stop"),
                                            ("ms", "b", "ms", "SIGTERM -> exit, %d processes")):
                calm, busy = series[False, kind][key], series[True, kind][key]
                ratio = median(busy) / median(calm) if median(calm) else float("inf")
                self.add_row("P11" + letter + suffix,
                             "%s, %s: %d vs %d on the host" % (what % CROWD_N, name, crowd, quiet),
                             busy, unit, "crowded/quiet <= %g" % CROWD_LIMIT, ratio, CROWD_LIMIT,
                             yard=calm, diff=ratio, diff_text="ratio",
                             extra={"ratio": ratio, "containment": kind,
                                    "host_processes_quiet": quiet, "host_processes_crowded": crowd,
                                    "blocks": 2 * rounds, "runs_per_block": per_block,
                                    "yardstick_note": "the same stop on the quiet host, "
                                                      "interleaved in blocks"})

    # Probes -----------------------------------------------------------------------------------

    def probe(self, argv):
        """Run argv to its end (60 s at most); (exit code, last stderr line)."""
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, env=self.env, timeout=60)
        except subprocess.TimeoutExpired:
            return None, "did not end within 60 s"
        lines = done.stderr.decode("utf-8", "replace").strip().splitlines()
        return done.returncode, lines[-1] if lines else ""

    def probe_containments(self):
        """Where the storms and P13 run (a PID namespace of their own when
        root); what --containment auto chooses here (said by the rows
        without a receipt); whether --containment cgroup works, on the host
        and in that namespace."""
        self.ns_prefix, self.ns_why_not = self.pid_namespace()
        argv, path = self.supervisor(["--timeout", "600"], ["true"])
        code, why = self.probe(argv)
        receipt = self.check_receipt(path, "probe (--containment auto)", exit_status=0) \
            if code is not None else None
        self.default_containment = receipt.get("containment") if receipt else None
        if receipt is None:
            self.note("probe: `supervisor.py --timeout 600 -- true` exited %s (%s)" % (code, why))
        places = [(False, [])] + ([(True, self.ns_prefix)] if self.ns_prefix else [])
        for inside, prefix in places:
            argv, path = self.supervisor(["--containment", "cgroup", "--timeout", "600"], ["true"])
            code, why = self.probe(prefix + argv)
            receipt = None
            if code == 0:
                receipt = self.check_receipt(path, "probe (--containment cgroup)",
                                             exit_status=0, containment="cgroup")
            elif os.path.exists(path):
                os.unlink(path)
            if receipt is not None and receipt.get("containment") == "cgroup":
                self.cgroup_why_not[inside] = None
            else:
                self.cgroup_why_not[inside] = "--containment cgroup exited %s%s (%s)" % (
                    code, " in a PID namespace" if inside else "", why)
        progress("probe: --containment auto chose %s; cgroup %s on the host%s" % (
            self.default_containment,
            "works" if self.cgroup_why_not[False] is None else "does not work",
            "" if not self.ns_prefix else ", %s in a PID namespace" % (
                "works" if self.cgroup_why_not[True] is None else "does not work")))

    # P12 --------------------------------------------------------------------------------------

    def pid_namespace(self):
        """(argv prefix, why not): unshare --pid --fork --mount-proc when root
        and it works here, else (None, the reason)."""
        if os.geteuid() != 0:
            return None, "not root"
        unshare = shutil.which("unshare")
        if unshare is None:
            return None, "no unshare on PATH"
        prefix = [unshare, "--pid", "--fork", "--mount-proc"]
        _, status = self.timed_run(prefix + [shutil.which("true")])
        if exit_code(status) != 0:
            return None, "unshare --pid failed here (exit %d)" % exit_code(status)
        return prefix, None

    def storm_run(self, row, i, containment, loaded):
        """One storm under the supervisor (in the PID namespace, when there is
        one), with BUSY_LOOPS busy loops beside it when loaded, from the storm's
        READY (or the deadline, if that comes first) to the end of the run:
        its receipt (None if unreadable), the bench's wall seconds (to
        ~10 ms), the exit status, its READY line, whether it had to be
        killed at STORM_ABORT, and when the loops started (s, or None)."""
        prefix = self.ns_prefix
        options = self.containment_options(containment)
        argv, receipt_path = self.supervisor(
            options + ["--timeout", "%g" % STORM_TIMEOUT, "--cleanup-timeout", "%g" % STORM_CLEANUP],
            [self.py, RESPAWNER] + STORM)
        context = "%s run %d" % (row, i)
        ready_path = os.path.join(self.out, "p12-%d" % self.run_id)
        fd = os.open(ready_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        aborted, loaded_at = False, None
        try:
            try:
                t0 = time.perf_counter()
                pid = self.spawn((prefix or []) + argv, stdout=fd)
            finally:
                os.close(fd)
            while not has_exited(pid):  # polled: a storm that wins must not hang the bench
                # The loops load the stop, not the storm's growth (under them it
                # is often not READY by the deadline, and then its root obeys).
                if loaded and loaded_at is None and (
                        time.perf_counter() - t0 >= STORM_TIMEOUT
                        or "READY" in (read_text(ready_path) or "")):
                    self.start_loops()
                    loaded_at = time.perf_counter() - t0
                if time.perf_counter() - t0 > STORM_ABORT:
                    # Our unreaped child (unshare or the supervisor). In a namespace
                    # its PID 1, the supervisor, comes to us and the sweep kills it.
                    os.kill(pid, signal.SIGKILL)
                    aborted = True
                    self.note("%s: still running after %g s; killed" % (context, STORM_ABORT))
                    break
                time.sleep(0.01)
            _, status = os.waitpid(pid, 0)
            wall = time.perf_counter() - t0
            # Without a namespace the storm's leftovers are ours now: reap them, and
            # kill by pid what is still alive after the grace (noted: a failed drain).
            self.sweep(context, expected=aborted)
        finally:
            self.stop_loops()
        # The storm's root ignores SIGTERM once READY: then the stop SIGKILLs
        # the command (137); before (a deadline that comes first) it is 124.
        expected = {"stop_reason": "timeout", "exit_status": (124, 137)}
        if containment is not None:
            expected["containment"] = containment
        if containment == "children":  # a race for the CPU: the row counts the confirmed
            expected.update(cleanup_confirmed=(True, False), exit_status=(124, 137, 125))
        receipt = self.check_receipt(receipt_path, context, tag=row, **expected)
        code = exit_code(status)
        if code not in expected["exit_status"] and not aborted:
            self.note("%s: %s exited %d, expected %s" % (
                context, "unshare" if prefix else "the supervisor", code,
                " or ".join(map(str, expected["exit_status"]))))
        ready = (read_text(ready_path) or "").strip()
        os.unlink(ready_path)
        return {"receipt": receipt, "wall": wall, "exit": code, "ready": ready, "aborted": aborted,
                "loaded_at": loaded_at}

    def p12_storm(self):
        if not os.path.exists(RESPAWNER):
            self.note("P12: %s not found; no storm rows" % RESPAWNER)
            return
        inside = self.ns_prefix is not None
        count = max(1, min(self.pairs_big, 3 if self.quick else 5))
        variants = []
        for row, containment, loaded in STORM_VARIANTS:
            if containment == "cgroup" and self.cgroup_why_not.get(inside):
                self.note("%s: skipped: %s" % (row, self.cgroup_why_not[inside]))
            else:
                variants.append((row, containment, loaded))
        where = "own PID namespace" if inside else "no PID namespace: " + self.ns_why_not
        self.begin("P12 storm: %d variants x %d runs, interleaved (%s)"
                   % (len(variants), count, where))
        runs = dict((v[0], []) for v in variants)
        for i in range(count):
            for row, containment, loaded in variants[i % len(variants):] + variants[:i % len(variants)]:
                if runs[row] and runs[row][-1]["aborted"]:
                    continue  # a miss already; the rest would cost STORM_ABORT each
                runs[row].append(self.storm_run(row, i, containment, loaded))
        summaries = dict((row, self.storm_summary(row, runs[row], count)) for row in runs)
        for row, containment, loaded in variants:
            self.storm_rows(row, containment, loaded, summaries[row], count)

    def storm_summary(self, row, runs, count):
        """The figures of one variant's runs (the JSON's, and the rows')."""
        receipts = [r["receipt"] for r in runs if r["receipt"] is not None]
        durations = [rc["duration_s"] for rc in receipts]
        drains, steps = [], {}
        for k, rc in enumerate(receipts):
            for step in rc.get("ladder") or []:
                steps.setdefault(step["step"], []).append(step["duration_s"])
            draining = [s["duration_s"] for s in rc.get("ladder") or [] if s["step"] == "draining"]
            if draining:
                drains.append(draining[0] * 1000)
            else:
                self.note("%s: a run without a draining step in the receipt's ladder" % row)
        lines = [r["ready"] for r in runs]
        if set(lines) - set(["READY 255", ""]):
            self.note("%s: the storm said %s, expected READY 255" % (row, sorted(set(lines))))
        early = lines.count("")
        if early:
            self.note("%s: %d of %d runs reached the deadline before the storm was READY "
                      "(it was still growing; its root still obeyed SIGTERM)" % (row, early, len(runs)))
        # A run without a receipt has no figures: it fails a check (the max is
        # then nan), and the figures are over the runs that have one.
        whole = len(receipts) == count
        return {"runs": len(runs), "runs_planned": count,
                "confirmed_runs": sum(rc.get("cleanup_confirmed") is True for rc in receipts),
                "ready_runs": lines.count("READY 255"),
                "exit_statuses": [r["exit"] for r in runs],
                "duration_s": durations, "duration_s_median": median(durations),
                "duration_s_max": max(durations) if whole else float("nan"),
                "draining_ms": drains, "draining_ms_median": median(drains),
                "draining_ms_max": max(drains) if whole and len(drains) == count else float("nan"),
                "loops_started_s": [None if r["loaded_at"] is None else round(r["loaded_at"], 3)
                                    for r in runs],
                "wall_s": [round(r["wall"], 4) for r in runs],
                "wall_s_median": median([r["wall"] for r in runs]),
                "step_duration_s_medians": dict((k, median(v)) for k, v in steps.items()),
                "survivors_counts": [rc.get("survivors_count") for rc in receipts],
                "containment": sorted(str(c) for c in self.seen.get(row, ()))}

    def storm_rows(self, row, containment, loaded, s, count):
        """The rows of one variant, from its summary s (see storm_summary)."""
        extra = dict(s, pid_namespace=self.ns_prefix is not None,
                     pid_namespace_note=self.ns_why_not, loaded=loaded,
                     busy_loops=BUSY_LOOPS if loaded else 0,
                     command="PY %s %s" % (RESPAWNER, " ".join(STORM)),
                     options=" ".join(self.containment_options(containment) + [
                         "--timeout", "%g" % STORM_TIMEOUT, "--cleanup-timeout", "%g" % STORM_CLEANUP]))
        confirmed, drains = s["confirmed_runs"], s["draining_ms"] or [float("nan")]
        how = "loaded (%d busy loops)" % BUSY_LOOPS if loaded else "quiet"
        if row == "P12":
            passed = confirmed == count and s["duration_s_max"] <= STORM_BOUND  # nan: False
            extra["bound_s"] = STORM_BOUND
            self.add_row("P12", "storm, 255 in own sessions, leaves respawn every 2 ms (%s)%s: "
                         "duration_s" % ("own PID namespace" if self.ns_prefix else "no PID namespace",
                                         self.contained(row)),
                         s["duration_s"] or [float("nan")], "s",
                         "%d/%d confirmed, max <= %g s" % (confirmed, count, STORM_BOUND),
                         s["duration_s_max"], STORM_BOUND, passed=passed, extra=extra)
            self.add_row("P12-drain", "storm: the receipt's draining step (info)%s"
                         % self.contained(row), drains, "ms", "info", None,
                         extra={"runs": s["runs"], "confirmed_runs": confirmed,
                                "pid_namespace": self.ns_prefix is not None})
            return
        what = "storm%s, %s: draining step (duration_s median %.2f s)" % (
            self.contained(row), how, s["duration_s_median"])
        limit = STORM_DRAIN_LIMIT * 1000
        if containment == "cgroup":
            passed = confirmed == count and s["draining_ms_max"] <= limit
            extra["draining_limit_ms"] = limit
            self.add_row(row, what, drains, "ms", "%d/%d confirmed, max <= %g ms" % (
                confirmed, count, limit), s["draining_ms_max"], limit, passed=passed, extra=extra)
        else:  # the walk: a race for the CPU with the leaves; the runs confirmed are the figure
            self.add_row(row, what, drains, "ms", "info: %d/%d confirmed" % (confirmed, count),
                         None, extra=extra)

    # P13 --------------------------------------------------------------------------------------

    def sleepers_of(self, pid):
        """{pid: start time} of the P13 helper's children: the helper is the
        supervisor's child, below unshare when in a namespace (host pids:
        the bench reads the host's /proc)."""
        def kids(p):
            text = read_text("/proc/%d/task/%d/children" % (p, p)) or ""
            return [int(x) for x in text.split()]
        supervisor = kids(pid) if self.ns_prefix else [pid]
        helpers = [c for s in supervisor for c in kids(s)]
        found = {}
        for helper in helpers:
            for child in kids(helper):
                start = start_time(child)
                if start is not None:
                    found[child] = start
        return found

    def start_fanout(self, argv, n, context, timeout=READY_TIMEOUT):
        """Spawn argv, whose command is FANOUT_HELPER, with stdout on a pipe,
        and wait for its "READY n": (pid, the pipe's read end, to close once
        the run is over)."""
        read_end, write_end = os.pipe()
        try:
            pid = self.spawn(argv, stdout=write_end)
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
        try:
            line = read_ready(read_end, context + " helper", timeout=timeout)
        except BaseException:
            os.close(read_end)
            raise
        if line != "READY %d" % n:
            self.note("%s: the helper said %r" % (context, line))
        return pid, read_end

    def many_run(self, containment, i):
        """One P13 run: (receipt or None, seconds from the stop file to the
        exit, whether it had to be killed, the sleeps left alive after it)."""
        context = "P13-%s run %d" % (containment, i)
        options = self.containment_options(containment)
        stop = os.path.join(self.stops, "p13-stop")
        sleep = os.path.realpath(shutil.which("sleep"))
        argv, receipt_path = self.supervisor(
            options + ["--timeout", "600", "--stop-file", stop],
            [self.py, "-I", "-S", self.fanout, str(MANY_N), "sessions", sleep])
        aborted, sleepers, read_end = False, {}, None
        try:
            pid, read_end = self.start_fanout((self.ns_prefix or []) + argv, MANY_N, context,
                                              timeout=2 * READY_TIMEOUT)
            sleepers = self.sleepers_of(pid)
            if len(sleepers) != MANY_N:
                self.note("%s: %d sleeps found below the helper, expected %d"
                          % (context, len(sleepers), MANY_N))
            created = time.monotonic()
            os.close(os.open(stop, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644))
            while not has_exited(pid):
                if time.monotonic() - created > MANY_ABORT:
                    os.kill(pid, signal.SIGKILL)  # our unreaped child; the sweep does the rest
                    aborted = True
                    self.note("%s: still running %g s after the stop file; killed"
                              % (context, MANY_ABORT))
                    break
                time.sleep(0.01)
            _, status = os.waitpid(pid, 0)
            to_exit = time.monotonic() - created
        finally:
            if read_end is not None:
                os.close(read_end)
            if os.path.exists(stop):
                os.unlink(stop)
        self.sweep(context, expected=aborted)
        left = self.end_sleepers(sleepers, context)
        receipt = self.check_receipt(receipt_path, context, tag="P13-" + containment,
                                     stop_reason="stop_file", exit_status=124,
                                     containment=containment)
        if exit_code(status) != 124 and not aborted:
            self.note("%s: %s exited %d, expected 124" % (
                context, "unshare" if self.ns_prefix else "the supervisor", exit_code(status)))
        return receipt, to_exit, aborted, left

    def end_sleepers(self, sleepers, context):
        """How many of the P13 sleeps outlived their run (same pid, same start
        time); those are killed by their process group (each leads its own
        session) and reaped. Within a PID namespace none can: it died with
        its PID 1."""
        left = [p for p, start in sleepers.items() if start_time(p) == start]
        if left:
            self.note("%s: %d of the %d sleeps outlived the run; killed by process group"
                      % (context, len(left), len(sleepers)))
            for p in left:
                stat = read_text("/proc/%d/stat" % p)
                if stat and int(stat.rsplit(")", 1)[1].split()[2]) == p:  # its own group
                    try:
                        os.killpg(p, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            self.sweep(context + " (the sleeps left)", expected=True)
        return len(left)

    def p13_many_sessions(self):
        modes = ["children"]
        if self.cgroup_why_not.get(self.ns_prefix is not None) is None:
            modes.append("cgroup")
        else:
            self.note("P13-cgroup: skipped: %s" % self.cgroup_why_not[self.ns_prefix is not None])
        count = 1 if self.quick else 2
        self.begin("P13 forced stop of %d in own sessions ignoring SIGTERM, --cleanup-timeout %g: "
                 "%s, %d run(s) each (%s)" % (MANY_N, MANY_CLEANUP, ", ".join(modes), count,
                                             "own PID namespace" if self.ns_prefix
                                             else "no PID namespace: " + self.ns_why_not))
        runs = dict((m, []) for m in modes)
        for i in range(count):
            for mode in modes[i % len(modes):] + modes[:i % len(modes)]:
                if runs[mode] and runs[mode][-1][2]:
                    continue  # aborted: a miss already
                runs[mode].append(self.many_run(mode, i))
        for mode in modes:
            receipts = [r[0] for r in runs[mode] if r[0] is not None]
            confirmed = sum(rc.get("cleanup_confirmed") is True for rc in receipts)
            drains = [s["duration_s"] * 1000 for rc in receipts for s in rc.get("ladder") or []
                      if s["step"] == "draining"]
            durations = [rc["duration_s"] for rc in receipts]
            worst = max(drains) if len(drains) == count else float("nan")
            limit = MANY_CLEANUP * 1000
            steps = {}
            for rc in receipts:
                for step in rc.get("ladder") or []:
                    steps.setdefault(step["step"], []).append(step["duration_s"])
            tag = "P13-" + mode
            self.add_row(tag, "forced stop, %d in own sessions ignoring SIGTERM%s: draining step "
                         "(duration_s median %.1f s)" % (MANY_N, self.contained(tag), median(durations)),
                         drains or [float("nan")], "ms", "%d/%d confirmed, max <= %g ms" % (
                             confirmed, count, limit), worst, limit,
                         passed=confirmed == count and worst <= limit,
                         extra={"runs": len(runs[mode]), "runs_planned": count,
                                "confirmed_runs": confirmed, "duration_s": durations,
                                "duration_s_median": median(durations),
                                "stop_file_to_exit_s": [round(r[1], 4) for r in runs[mode]],
                                "step_duration_s": dict((k, v) for k, v in steps.items()),
                                "drained_counts": [rc.get("drained_count") for rc in receipts],
                                "survivors_counts": [rc.get("survivors_count") for rc in receipts],
                                "sleeps_left_after": [r[3] for r in runs[mode]],
                                "containment": mode, "cleanup_timeout_s": MANY_CLEANUP,
                                "pid_namespace": self.ns_prefix is not None})

    # P14 --------------------------------------------------------------------------------------

    def argv_run(self, i, sh):
        """One P14 run: (receipt or None, its size in bytes, seconds from the
        receipt's ended_at to the bench seeing the exit, seconds from the stop
        file to the exit)."""
        context = "P14 run %d" % i
        stop = os.path.join(self.stops, "p14-stop")
        argv, receipt_path = self.supervisor(
            ["--timeout", "600", "--stop-file", stop],
            [self.py, "-I", "-S", self.fanout, str(ARGV_N), "argv", str(ARGV_COUNT),
             str(ARGV_BYTES), sh])
        read_end = None
        try:
            pid, read_end = self.start_fanout(argv, ARGV_N, context)
            created = time.monotonic()
            os.close(os.open(stop, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644))
            wait_exited(pid)
            exited_wall, exited = time.time(), time.monotonic()
            _, status = os.waitpid(pid, 0)
        finally:
            if read_end is not None:
                os.close(read_end)
            if os.path.exists(stop):
                os.unlink(stop)
        size = os.path.getsize(receipt_path) if os.path.exists(receipt_path) else None
        receipt = self.check_receipt(receipt_path, context, tag="P14", stop_reason="stop_file",
                                     exit_status=124, drained_count=ARGV_DRAINED)
        schema = receipt.get("schema_version") if receipt else None
        if receipt is not None and (not isinstance(schema, int) or schema < RECEIPT_SCHEMA_MIN
                                    or schema != declared_schema()):
            self.note("%s: receipt schema_version %r: supervisor.py declares %r (P14 needs %d "
                      "or later)" % (context, schema, declared_schema(), RECEIPT_SCHEMA_MIN))
        if exit_code(status) != 124:
            self.note("%s: the supervisor exited %d, expected 124" % (context, exit_code(status)))
        self.sweep(context)
        after = exited_wall - parse_utc(receipt["ended_at"]) if receipt else float("nan")
        return receipt, size, after, exited - created

    def p14_receipt_size(self):
        sh = shutil.which("sh")
        if sh is None:
            self.note("P14: no sh on PATH; no receipt-size rows")
            return
        count = 2 if self.quick else 5
        self.begin("P14 receipt of %d sh with %d x %d bytes of argv each, %d runs"
                 % (ARGV_N, ARGV_COUNT, ARGV_BYTES, count))
        runs = [self.argv_run(i, sh) for i in range(count + 1)][1:]  # one warm-up
        receipts = [r[0] for r in runs if r[0] is not None]
        whole = len(receipts) == count
        self._p14_size_rows(runs, receipts, whole, count, sh)
        afters = [r[2] * 1000 for r in runs if r[2] == r[2]]
        worst = max(afters) if whole and len(afters) == count else float("nan")
        self.add_row("P14", "receipt of %d processes: its ended_at -> the supervisor's exit%s"
                     % (ARGV_DRAINED, self.contained("P14")), afters or [float("nan")], "ms",
                     "max <= %g ms" % (RECEIPT_EXIT_LIMIT * 1000), worst, RECEIPT_EXIT_LIMIT * 1000,
                     extra={"stop_file_to_exit_ms": [round(r[3] * 1000, 3) for r in runs],
                            "yardstick_note": "the receipt's ended_at (supervise() returned), "
                                              "wall clock; the exit as the bench's waitid saw it"})

    def _p14_size_rows(self, runs, receipts, whole, count, sh):
        """P14-size: the receipt stays small whatever the argv; P14-list: it
        counts every drained process and lists the first RECEIPT_LIST_LIMIT."""
        sizes = [r[1] / 1024.0 for r in runs if r[1] is not None]
        counts = [rc.get("drained_count") for rc in receipts]
        listed = [len(rc.get("drained") or []) for rc in receipts]
        entries = [e for rc in receipts for key in ("drained", "survivors", "preserved",
                                                    "unattributed") for e in rc.get(key) or []]
        # Since schema 4: names, never argv; no `omitted`, no `command_truncated`.
        stale = sorted(set(k for e in entries for k in e if k in ("command", "command_truncated"))
                       | set(k for rc in receipts for k in rc if k in ("omitted",)))
        if stale:
            self.note("P14: receipt keys of schema 3 found: %s" % ", ".join(stale))
        names = [len(e["name"].encode("utf-8")) for e in entries if isinstance(e.get("name"), str)]
        extra = {"receipt_bytes": [r[1] for r in runs], "drained_counts": counts,
                 "drained_listed": listed, "longest_name_bytes": max(names) if names else None,
                 "argv_bytes_each": ARGV_COUNT * ARGV_BYTES,
                 "command": "PY -I -S argv.py %d %d %d %s" % (ARGV_N, ARGV_COUNT, ARGV_BYTES, sh)}
        worst = max(sizes) if whole and len(sizes) == count else float("nan")
        schemas = sorted(set(str(rc.get("schema_version")) for rc in receipts))
        self.add_row("P14-size", "receipt (schema %s) of %d processes, %d sh with %d KB argv "
                     "each%s: size" % ("/".join(schemas), ARGV_DRAINED, ARGV_N,
                                       ARGV_COUNT * ARGV_BYTES // 1000, self.contained("P14")),
                     sizes or [float("nan")], "KiB",
                     "max <= %g KiB" % RECEIPT_SIZE_LIMIT_KIB, worst, RECEIPT_SIZE_LIMIT_KIB,
                     extra=extra)
        passed = whole and all(c == ARGV_DRAINED for c in counts) \
            and all(n == RECEIPT_LIST_LIMIT for n in listed)
        self.add_row("P14-list", "receipt of %d processes: drained_count, and %d listed in "
                     "`drained` (every run)" % (ARGV_DRAINED, RECEIPT_LIST_LIMIT),
                     [float(c) for c in counts if c is not None] or [float("nan")], "processes",
                     "%d counted, %d listed" % (ARGV_DRAINED, RECEIPT_LIST_LIMIT), None,
                     passed=passed, extra={"drained_counts": counts, "drained_listed": listed})

    # P16 --------------------------------------------------------------------------------------

    def p16_deadline_stops(self):
        """P16: a stop at the deadline of STOP_N processes obeying SIGTERM,
        from the deadline to the exit (the receipt on disk, confirmed), ours
        beside NeMo Gym's and GNU timeout's, in rounds whose order rotates;
        for each tree shape (STOP_SHAPES)."""
        if self.nemo is None:
            self.note("P16: no --nemo PATH: no deadline stops beside NeMo Gym's")
            return
        if tuple(self.python_check["version_info"][:2]) < NEMO_MIN_PYTHON:
            self.note("P16: NeMo Gym's script needs Python %d.%d or later" % NEMO_MIN_PYTHON)
            return
        nemo = self.copy_as("p16-nemo", self.nemo)
        tools = dict(reference_tools())
        timeout = tools["timeout"][0] if "timeout" in tools else None
        who = ["ours", "nemo"] + (["timeout"] if timeout else [])
        count = self.pairs_big
        for shape, sessions in STOP_SHAPES:
            self.begin("P16-%s a deadline stop of %d processes (%d in sessions of their own), "
                       "%d rounds of %s" % (shape, STOP_N, sessions, count, ", ".join(who)), "P16")
            runs, offsets = dict((w, []) for w in who), []
            for i in range(count + 1):
                offsets.append(self.exec_offset())
                for w in who[i % len(who):] + who[:i % len(who)]:
                    run = self.deadline_stop(w, sessions, nemo, timeout)
                    if i:  # the first round warms up
                        runs[w].append(run)
            self.p16_rows(shape, sessions, runs, median(offsets[1:] or offsets))

    def exec_offset(self):
        """Seconds from posix_spawn's return (the helper's exec) to the tree
        helper's first statement, as it stamps it: P16 dates a run's exec,
        and so NeMo Gym's and timeout's deadlines, by the stamp minus this."""
        read_end, write_end = os.pipe()
        try:
            pid = self.spawn([self.py, "-I", "-S", self.tree, "1", "obey"], stdout=write_end)
            spawned = time.monotonic()
            os.close(write_end)
            write_end = None
            line = read_ready(read_end, "P16 calibration")
        finally:
            os.close(read_end)
            if write_end is not None:
                os.close(write_end)
        os.kill(pid, signal.SIGTERM)  # our unreaped child
        os.waitpid(pid, 0)
        return float(line.split()[2]) - spawned

    def deadline_stop(self, who, sessions, nemo, timeout):
        """One P16 run: `ours` (supervisor.py as a script, with a receipt),
        `nemo` (NeMo Gym's script) or `timeout` (GNU timeout) running the
        tree helper with --timeout STOP_TIMEOUT. A dict: the helper's stamp
        and when the bench read its ready line (monotonic), when the bench
        saw the exit (monotonic and wall), ours' deadline by its receipt
        (wall), the CPU from the ready line to the exit (ms), whether the
        receipt was on disk and confirmed at the exit, the exit status."""
        command = [self.py, "-I", "-S", self.tree, str(STOP_N), "obey", str(sessions)]
        seconds = "%g" % STOP_TIMEOUT
        receipt_path = None
        if who == "ours":
            argv, receipt_path = self.supervisor(["--timeout", seconds], command)
        elif who == "nemo":
            self.run_id += 1
            receipt_path = os.path.join(self.receipts, "nemo-%d.json" % self.run_id)
            argv = [self.py, "-I", nemo, "--timeout", seconds, "--receipt", receipt_path,
                    "--"] + command
        else:
            argv = [timeout, seconds] + command
        read_end, write_end = os.pipe()
        try:
            pid = self.spawn(argv, stdout=write_end)
            os.close(write_end)
            write_end = None
            line = read_ready(read_end, "P16 tree helper (%s)" % who)
            ready = time.monotonic()
            cpu0 = schedstat_ns(pid)
            wait_exited(pid)
            ended, ended_wall = time.monotonic(), time.time()
            cpu = (schedstat_ns(pid) - cpu0) / 1e6
            on_disk = receipt_path is not None and os.path.exists(receipt_path)
            _, status = os.waitpid(pid, 0)
        finally:
            os.close(read_end)
            if write_end is not None:
                os.close(write_end)
        run = {"stamp": float(line.split()[2]), "ready": ready, "ended": ended,
               "ended_wall": ended_wall, "cpu_ms": cpu, "exit": exit_code(status),
               "deadline_wall": None, "confirmed": None, "on_disk": on_disk, "ladder": None}
        context = "P16 %s (%d in sessions)" % (who, sessions)
        if who == "ours":
            receipt = self.check_receipt(receipt_path, context, tag="P16", stop_reason="timeout",
                                         exit_status=124)
            if receipt is not None:
                run["deadline_wall"] = parse_utc(receipt["started_at"]) + STOP_TIMEOUT
                run["confirmed"] = receipt.get("cleanup_confirmed")
                run["ladder"] = dict((step["step"], step["duration_s"])
                                     for step in receipt.get("ladder") or [])
            expected = 124
        elif who == "nemo":
            try:
                with open(receipt_path) as f:
                    receipt = json.load(f)
                os.unlink(receipt_path)
            except (OSError, ValueError) as e:
                receipt = {}
                self.note("%s: no readable receipt (%s)" % (context, e))
            run["confirmed"] = receipt.get("cleanup_confirmed")
            if receipt and (receipt.get("cleanup_confirmed") is not True
                            or receipt.get("timed_out") is not True):
                self.note("%s: receipt %r" % (context, receipt))
            expected = 0
        else:
            expected = 124
        if run["exit"] != expected:
            self.note("%s exited %d, expected %d" % (context, run["exit"], expected))
        # timeout does not drain: what it left (the sessions) is ours now, killed at once.
        self.sweep(context, expected=who == "timeout", grace=0.0 if who == "timeout" else 2.0)
        return run

    def p16_rows(self, shape, sessions, runs, offset):
        """P16-SHAPE: ours over NeMo Gym's, deadline -> exit; P16-ref-SHAPE:
        GNU timeout's; P16c-SHAPE (info): the CPU from the ready line to the
        exit. NeMo Gym's and timeout's deadline: the helper's stamp - offset
        + STOP_TIMEOUT; ours: its receipt's started_at + STOP_TIMEOUT (the
        same by the stamp in the JSON). A run whose tree was not ready by the
        deadline is left out, with a note."""
        ms = {}
        for w, rs in runs.items():
            kept = []
            for r in rs:
                deadline = r["stamp"] - offset + STOP_TIMEOUT
                if r["ready"] > deadline:
                    self.note("P16-%s %s: a tree not ready by the deadline (%.0f ms late): "
                              "left out" % (shape, w, (r["ready"] - deadline) * 1000))
                    continue
                if w == "ours" and r["deadline_wall"] is not None:
                    r["ms"] = (r["ended_wall"] - r["deadline_wall"]) * 1000
                else:
                    r["ms"] = (r["ended"] - deadline) * 1000
                r["ms_by_stamp"] = (r["ended"] - deadline) * 1000
                kept.append(r)
            ms[w] = kept
        ours, nemo = [r["ms"] for r in ms["ours"]], [r["ms"] for r in ms["nemo"]]
        confirmed = dict((w, sum(1 for r in ms[w] if r["confirmed"] is True and r["on_disk"]))
                         for w in ("ours", "nemo"))
        timeout_ms = [r["ms"] for r in ms.get("timeout", [])]
        ratio = median(ours) / median(nemo) if ours and nemo else float("nan")
        steps = {}
        for r in ms["ours"]:
            for k, v in (r["ladder"] or {}).items():
                steps.setdefault(k, []).append(v * 1000)
        what = "%d processes obeying SIGTERM%s" % (
            STOP_N, ", %d of them in sessions of their own" % sessions if sessions
            else ", all in the command's group")
        passed = (ratio <= STOP_LIMIT and confirmed["ours"] == len(ours) and len(ours) > 0
                  and confirmed["nemo"] == len(nemo))
        self.add_row("P16-" + shape, "deadline -> exit, receipt on disk: %s, ours over NeMo "
                     "Gym's%s" % (what, self.contained("P16")), ours or [float("nan")], "ms",
                     "ratio <= %g, all confirmed" % STOP_LIMIT, ratio, STOP_LIMIT,
                     yard=nemo or None, diff=ratio, diff_text="ratio", passed=passed,
                     extra={"timeout_ms": [round(x, 3) for x in timeout_ms],
                            "timeout_ms_median": median(timeout_ms),
                            "confirmed_on_disk": confirmed,
                            "ours_ms_by_stamp": [round(r["ms_by_stamp"], 3) for r in ms["ours"]],
                            "exec_offset_ms": offset * 1000,
                            "ours_ladder_ms_medians": dict((k, median(v))
                                                           for k, v in steps.items()),
                            "timeout_s": STOP_TIMEOUT, "sessions": sessions,
                            "yardstick_note": "NeMo Gym's, same rounds; its deadline dated by "
                                              "the command's stamp"})
        if timeout_ms:
            self.add_row("P16-ref-" + shape, "GNU timeout, the same stop: deadline -> its exit "
                         "(no drain: it exits with its child), over NeMo Gym's", timeout_ms, "ms",
                         "reference", None, yard=nemo or None,
                         diff=median(timeout_ms) / median(nemo) if nemo else None,
                         diff_text="ratio")
        cpu = dict((w, [r["cpu_ms"] for r in ms[w]]) for w in ms)
        self.add_row("P16c-" + shape, "CPU from the tree's ready line to the exit, ours over "
                     "NeMo Gym's (%s)" % shape, cpu["ours"] or [float("nan")], "ms CPU", "info",
                     None, yard=cpu["nemo"] or None,
                     diff=median(cpu["ours"]) / median(cpu["nemo"]) if cpu["nemo"] else None,
                     diff_text="ratio",
                     extra={"timeout_cpu_ms_median": median(cpu.get("timeout", []))})

    # P18 --------------------------------------------------------------------------------------

    def p18_density(self):
        """P18: density. N supervisors at once, each `sh -c 'setsid sleep 600 &
        sleep 600'`, one absolute deadline for all, the pyz, NeMo Gym's script
        and the script in turn (rounds, the order rotating): RSS over the bare
        interpreter each, idle CPU of all, the deadline -> the last exit,
        receipts confirmed, processes left alive (see the docstring)."""
        if self.nemo is None:
            self.note("P18: no --nemo PATH: no density beside NeMo Gym's")
            return
        if tuple(self.python_check["version_info"][:2]) < NEMO_MIN_PYTHON:
            self.note("P18: NeMo Gym's script needs Python %d.%d or later" % NEMO_MIN_PYTHON)
            return
        prefixes = {"pyz": [self.py, "-I", self.pyz_path()],
                    "script": [self.py, "-I", self.copy_as("p18-script", SUPERVISOR)],
                    "nemo": [self.py, "-I", self.copy_as("p18-nemo", self.nemo)]}
        n, rounds = self.density_n, self.density_rounds
        self.begin("P18 density: %d supervisors at once, one deadline, %d round(s) of %s"
                   % (n, rounds, ", ".join(DENSITY_WAYS)))
        sides = dict((way, []) for way in DENSITY_WAYS)
        for r in range(rounds):
            for way in DENSITY_WAYS[r % 3:] + DENSITY_WAYS[:r % 3]:
                progress("  P18 round %d: %d x %s" % (r + 1, n, way))
                sides[way].append(self.density_side(way, prefixes[way], n))
        self.p18_rows(n, sides)

    def density_side(self, way, prefix, n):
        """One side of one P18 round: DENSITY_BARE bare interpreters, then n
        supervisors started one after another (the next once the last one's
        command is forked), each given --timeout = the shared deadline - now.
        A dict of the figures (p18_rows reads them)."""
        context = "P18 " + way
        bare_argv = [self.py, "-I", "-c", "import time; time.sleep(600)"]
        bares = [self.spawn(bare_argv) for _ in range(min(n, DENSITY_BARE))]
        sups = {}  # pid -> {"receipt", "timeout"}
        start = time.monotonic()
        end = start + n * DENSITY_SPAWN_EACH + DENSITY_SETTLE + DENSITY_WINDOW
        end_boot = time.clock_gettime(time.CLOCK_BOOTTIME) + (end - time.monotonic())
        try:
            for _ in range(n):
                timeout = end - time.monotonic()
                if timeout < DENSITY_SETTLE + DENSITY_WINDOW:
                    raise BenchError("P18 %s: %d of %d supervisors started in %.0f s (budget "
                                     "%g s each): the machine is too busy" % (
                                         way, len(sups), n, time.monotonic() - start,
                                         DENSITY_SPAWN_EACH))
                self.run_id += 1
                receipt = os.path.join(self.receipts, "p18-%d.json" % self.run_id)
                argv = prefix + ["--timeout", "%.3f" % timeout]
                if way != "nemo":
                    argv += ["--workdir", self.work]
                pid = self.spawn(argv + ["--receipt", receipt, "--"] + DENSITY_COMMAND)
                sups[pid] = {"receipt": receipt, "timeout": float("%.3f" % timeout)}
                self.density_forked(pid, context)
            started = time.monotonic() - start
            trees = dict((pid, self.density_tree(pid, context)) for pid in sups)
            time.sleep(DENSITY_SETTLE)
            kib = dict((pid, status_kib(pid, "VmRSS")) for pid in list(sups) + bares)
            # Idle: every supervisor's CPU and wake-ups (schedstat's first and
            # third fields), itself and any fork of its own, up to 1 s before
            # the deadline.
            teams = dict((pid, [pid] + forks_of(pid)) for pid in sups)
            idle0, t0 = self.density_schedstat(teams), time.monotonic()
            time.sleep(max(0.0, end - 1.0 - time.monotonic()))
            idle1, t1 = self.density_schedstat(teams), time.monotonic()
        except BaseException:
            for pid in sups:
                os.kill(pid, signal.SIGKILL)  # our unreaped child; the sweep ends its tree
            raise
        finally:
            for pid in bares:
                os.kill(pid, signal.SIGKILL)  # our unreaped child
                os.waitpid(pid, 0)
        exits = self.density_exits(sups, end, context)
        left = self.density_left(trees)
        self.sweep(context, expected=True, grace=0.0)
        lags = [start_ticks / float(os.sysconf("SC_CLK_TCK")) + sups[pid]["timeout"] - end_boot
                for pid, tree in trees.items() for start_ticks in [tree[0][1]]]
        confirmed, statuses = 0, {}
        for pid, (when, code) in exits.items():
            statuses[code] = statuses.get(code, 0) + 1
            path = sups[pid]["receipt"]
            if way == "nemo":
                receipt = self.nemo_receipt(path, context)
                ok = code == 0 and receipt.get("timed_out") is True
            else:
                receipt = self.check_receipt(path, context, tag="P18", stop_reason="timeout",
                                             exit_status=124) or {}
                ok = code == 124
            confirmed += ok and receipt.get("cleanup_confirmed") is True
        scale = 60.0 / (t1 - t0)
        cpu = [(idle1[pid][0] - idle0[pid][0]) / 1e6 * scale for pid in sups]
        wakeups = sum(idle1[pid][1] - idle0[pid][1] for pid in sups)
        mib = 1024.0
        return {"n": n, "rss_mib": [kib[pid] / mib for pid in sups if kib[pid] is not None],
                "bare_rss_mib": [kib[pid] / mib for pid in bares if kib[pid] is not None],
                "idle_ms_per_min_all": sum(cpu), "idle_ms_per_min_each_median": median(cpu),
                "idle_wakeups": wakeups, "idle_window_s": t1 - t0,
                "last_exit_s": max(w for w, _ in exits.values()) - end if exits else float("nan"),
                "exit_s_median": median([w - end for w, _ in exits.values()]),
                "exited_before_deadline": sum(1 for w, _ in exits.values() if w < end),
                "own_deadline_lag_s_median": median(lags), "own_deadline_lag_s_max": max(lags),
                "confirmed": confirmed, "left_alive": left, "exit_statuses": statuses,
                "started_in_s": started}

    def density_forked(self, pid, context):
        """Wait until supervisor pid has forked its command (its children file
        names a child)."""
        deadline = time.monotonic() + READY_TIMEOUT
        while not read_text("/proc/%d/task/%d/children" % (pid, pid)):
            if has_exited(pid) or time.monotonic() > deadline:
                raise BenchError("%s: a supervisor did not start its command" % context)
            time.sleep(0.002)

    def density_tree(self, pid, context):
        """Wait until supervisor pid's tree is whole: sh, and its two sleeps,
        one of them in a session of its own; [(pid, start time)] of the
        three, sh first."""
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            kids = (read_text("/proc/%d/task/%d/children" % (pid, pid)) or "").split()
            if len(kids) == 1:
                sh = int(kids[0])
                sleeps = [int(k) for k in
                          (read_text("/proc/%d/task/%d/children" % (sh, sh)) or "").split()]
                stats = [read_text("/proc/%d/stat" % k) for k in sleeps]
                comms = [(read_text("/proc/%d/comm" % k) or "").strip() for k in sleeps]
                if len(sleeps) == 2 and comms == ["sleep", "sleep"] and None not in stats and \
                        sum(1 for k, st in zip(sleeps, stats)
                            if int(st.rsplit(")", 1)[1].split()[3]) == k) == 1:
                    tree = [(p, start_time(p)) for p in [sh] + sleeps]
                    if None not in [t for _, t in tree]:
                        return tree
            if has_exited(pid) or time.monotonic() > deadline:
                raise BenchError("%s: a supervisor's tree never became whole (sh and its two "
                                 "sleeps)" % context)
            time.sleep(0.002)

    @staticmethod
    def density_schedstat(teams):
        """{pid: (ns on a CPU, times run on a CPU)} of each team (a
        supervisor and its forks) together; a fork gone counts as nothing."""
        found = {}
        for pid, team in teams.items():
            ns = runs = 0
            for member in team:
                text = read_text("/proc/%d/schedstat" % member)
                if text is None:
                    if member == pid:
                        raise BenchError("P18: a supervisor ended before its deadline")
                    continue
                fields = text.split()
                ns, runs = ns + int(fields[0]), runs + int(fields[2])
            found[pid] = (ns, runs)
        return found

    def density_exits(self, sups, end, context):
        """From the deadline on, reap every child (the supervisors, and what
        may be handed to the bench); {supervisor pid: (monotonic time its
        exit was reaped, exit code)}. A supervisor still running
        DENSITY_ABORT s after the deadline is SIGKILLed (a miss)."""
        exits = {}

        def late(signum, frame):
            raise BenchError("late")
        time.sleep(max(0.0, end - time.monotonic()))
        old = signal.signal(signal.SIGALRM, late)
        signal.setitimer(signal.ITIMER_REAL, max(1.0, end + DENSITY_ABORT - time.monotonic()))
        try:
            while len(exits) < len(sups):
                pid, status = os.waitpid(-1, 0)
                if pid in sups:
                    exits[pid] = (time.monotonic(), exit_code(status))
        except BenchError:
            missing = [pid for pid in sups if pid not in exits]
            self.note("%s: %d supervisor(s) still running %g s after the deadline: killed"
                      % (context, len(missing), DENSITY_ABORT))
            for pid in missing:
                os.kill(pid, signal.SIGKILL)  # our child, unreaped
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        return exits

    @staticmethod
    def density_left(trees):
        """How many processes of the trees are still alive (the same pid and
        start time, not a zombie)."""
        left = 0
        for tree in trees.values():
            for pid, started in tree:
                text = read_text("/proc/%d/stat" % pid)
                if text and start_time(pid) == started and text.rsplit(")", 1)[1].split()[0] != "Z":
                    left += 1
        return left

    def nemo_receipt(self, path, context):
        """NeMo Gym's receipt, read and removed; {} (and a note) if none."""
        try:
            with open(path) as f:
                receipt = json.load(f)
            os.unlink(path)
        except (OSError, ValueError) as e:
            self.note("%s: no readable receipt (%s)" % (context, e))
            return {}
        if receipt.get("cleanup_confirmed") is not True or receipt.get("timed_out") is not True:
            self.note("%s: receipt %r" % (context, receipt))
        return receipt

    def p18_rows(self, n, sides):
        """P18's rows: RSS over bare each, idle CPU of all, the deadline ->
        the last exit; each way's, NeMo Gym's beside ours."""
        mib_bare = median([x for side in sides.values() for s in side for x in s["bare_rss_mib"]])
        nemo_stop = [s["last_exit_s"] * 1000 for s in sides["nemo"]]
        rounds = len(sides["nemo"])
        for way, how in (("pyz", "PY -I treereap.pyz"), ("script", "PY -I supervisor.py "
                                                          "(a copy)"),
                         ("nemo", "PY -I process_supervisor.py (NeMo Gym's)")):
            runs = sides[way]
            rss = [x for s in runs for x in s["rss_mib"]]
            over = median(rss) - mib_bare
            limit = DENSITY_RSS_LIMIT if way == "pyz" else None
            self.add_row("P18-rss-" + way, "density: RSS of each of %d at once, %s, over bare "
                         "PY -I%s" % (n, how, "" if way == "nemo" else self.contained("P18")),
                         rss, "MiB", "diff <= %g MiB" % limit if limit else "info",
                         over if limit else None, limit,
                         yard=[x for s in runs for x in s["bare_rss_mib"]],
                         extra={"max_over_bare_mib": max(rss) - mib_bare, "way": way})
            idle = [s["idle_ms_per_min_all"] for s in runs]
            wakeups = sum(s["idle_wakeups"] for s in runs)
            self.add_row("P18-idle-" + way, "density: idle CPU of all %d together, %s (ms per "
                         "minute of waiting)" % (n, how), idle, "ms/min",
                         "info" if way == "nemo" else "0 (no wake-up)",
                         None if way == "nemo" else wakeups, None,
                         passed=None if way == "nemo" else wakeups == 0,
                         extra={"wakeups": wakeups,
                                "window_s": [round(s["idle_window_s"], 2) for s in runs],
                                "each_median_ms_per_min": median(
                                    [s["idle_ms_per_min_each_median"] for s in runs])})
            stop = [s["last_exit_s"] * 1000 for s in runs]
            confirmed = sum(s["confirmed"] for s in runs)
            left = sum(s["left_alive"] for s in runs)
            extra = {"confirmed": confirmed, "of": n * rounds, "left_alive": left,
                     "exit_ms_median": [round(s["exit_s_median"] * 1000, 1) for s in runs],
                     "exited_before_deadline": sum(s["exited_before_deadline"] for s in runs),
                     "own_deadline_lag_ms_median": [round(s["own_deadline_lag_s_median"] * 1000,
                                                          1) for s in runs],
                     "own_deadline_lag_ms_max": [round(s["own_deadline_lag_s_max"] * 1000, 1)
                                                 for s in runs],
                     "exit_statuses": [s["exit_statuses"] for s in runs],
                     "started_in_s": [round(s["started_in_s"], 1) for s in runs]}
            what = "density: deadline -> the last of %d exits, %s; confirmed %d/%d, %d left " \
                   "alive" % (n, how, confirmed, n * rounds, left)
            if way == "nemo":
                self.add_row("P18-stop-nemo", what, stop, "ms", "reference", None, extra=extra)
                continue
            ratio = median(stop) / median(nemo_stop)
            self.add_row("P18-stop-" + way, what, stop, "ms",
                         "ratio <= %g, all confirmed, none left" % DENSITY_STOP_LIMIT, ratio,
                         DENSITY_STOP_LIMIT, yard=nemo_stop, diff=ratio, diff_text="ratio",
                         passed=(ratio <= DENSITY_STOP_LIMIT and confirmed == n * rounds
                                 and left == 0), extra=extra)

    # P17 --------------------------------------------------------------------------------------

    def p17_output(self):
        """P17a: --output with --max-output, 1 GiB as fast as a writer can,
        the supervisor's CPU beside cat's; P17b: a trickle, the supervisor's
        CPU beside the command's own."""
        dd, cat, sh = shutil.which("dd"), shutil.which("cat"), shutil.which("sh")
        if not (dd and cat and sh):
            self.note("P17: dd, cat and sh are needed on PATH: no output rows")
            return
        trickle = self._write("trickle.py", TRICKLE_HELPER)
        wait = [sh, "-c", 'sleep %g; exec "$@"' % OUTPUT_DELAY, "sh"]
        writer = wait + [dd, "if=/dev/zero", "bs=1M", "count=%d" % (OUTPUT_BYTES >> 20),
                         "status=none"]
        count = self.pairs_big
        self.begin("P17a --output F --max-output %s, %d MiB written as fast as dd can, beside "
                   "cat, %d pairs" % (OUTPUT_CAP, OUTPUT_BYTES >> 20, count), "P17")
        sup, cats = self.paired(lambda: self.output_supervised(writer, OUTPUT_BYTES, "P17a"),
                                lambda: self.output_cat(writer, OUTPUT_BYTES), count)
        ours = [x["cpu_ms"] for x in sup]
        ratio = median(ours) / median(cats)
        self.add_row("P17a", "--output F --max-output %s, `dd bs=1M` of %d MiB: the supervisor's "
                     "CPU from its command's start to its exit, over cat's copying the same pipe "
                     "(%d KiB) to a file beside F%s" % (OUTPUT_CAP, OUTPUT_BYTES >> 20,
                                                        OUTPUT_PIPE >> 10, self.contained("P17")),
                     ours, "ms CPU", "ratio <= %g" % OUTPUT_LIMIT, ratio, OUTPUT_LIMIT, yard=cats,
                     diff=ratio, diff_text="ratio",
                     extra={"whole_run_cpu_ms_median": median([x["whole_ms"] for x in sup]),
                            "stat_ticks_cpu_ms_median": median([x["ticks_ms"] for x in sup]),
                            "filesystem": filesystem_of(self.out),
                            "yardstick_note": "cat's user+sys (wait4), `writer | cat > file`"})
        runs = 1 if self.quick else 3
        self.begin("P17b --output F --max-output %s, one byte every %g us for %g s, %d runs "
                   "beside cat" % (OUTPUT_CAP, TRICKLE_PERIOD * 1e6, TRICKLE_SECONDS, runs), "P17")
        sup, own, cats, written = [], [], [], []
        for i in range(runs):
            for kind in (("sup", "cat") if i % 2 == 0 else ("cat", "sup")):
                stamp = os.path.join(self.out, "p17b-%s-%d" % (kind, i))
                command = wait + [self.py, "-I", "-S", trickle, "%g" % TRICKLE_SECONDS,
                                  "%g" % TRICKLE_PERIOD, stamp]
                if kind == "sup":
                    sup.append(self.output_supervised(command, None, "P17b")["cpu_ms"])
                else:
                    cats.append(self.output_cat(command, None))
                text = read_text(stamp)
                if text is None:
                    raise BenchError("P17b: the trickle wrote no stamp")
                os.unlink(stamp)
                n, cpu, wall = text.split()
                if kind == "sup":
                    own.append(float(cpu) * 1000)
                    written.append(int(n))
        ratio = median(sup) / median(own)
        self.add_row("P17b", "--output F --max-output %s, a command writing 1 byte every %g us "
                     "for %g s: the supervisor's CPU over the command's own%s" % (
                         OUTPUT_CAP, TRICKLE_PERIOD * 1e6, TRICKLE_SECONDS,
                         self.contained("P17")), sup, "ms CPU", "ratio <= 1", ratio, 1.0,
                     yard=own, diff=ratio, diff_text="ratio",
                     extra={"bytes_written": written, "cat_cpu_ms": [round(c, 3) for c in cats],
                            "cat_cpu_ms_median": median(cats),
                            "supervisor_us_per_byte": median(sup) * 1000 / median(written),
                            "cat_us_per_byte": median(cats) * 1000 / median(written),
                            "yardstick_note": "the command's time.process_time() at its end "
                                              "(a Python loop: write, sleep)"})

    def output_supervised(self, command, size, context):
        """One supervised run of command with --output F --max-output
        OUTPUT_CAP: the supervisor's CPU (its schedstat) from when its
        command runs (OUTPUT_DELAY before the first byte) to its exit, its
        whole run's, and /proc/PID/stat's utime+stime over the first (ms);
        the receipt's output is checked (size bytes seen, if given)."""
        out = os.path.join(self.out, "p17-sup.log")
        argv, receipt_path = self.supervisor(
            ["--timeout", "600", "--output", out, "--max-output", OUTPUT_CAP], command)
        pid = self.spawn(argv)
        deadline = time.monotonic() + READY_TIMEOUT
        while not (read_text("/proc/%d/task/%d/children" % (pid, pid)) or "").split():
            if has_exited(pid) or time.monotonic() > deadline:
                raise BenchError("%s: the supervisor did not start its command" % context)
            time.sleep(0.001)
        time.sleep(OUTPUT_DELAY / 4)  # its own start-up done, the writer still waiting
        cpu0, ticks0 = schedstat_ns(pid), stat_cpu_ticks(pid)
        wait_exited(pid)
        cpu1, ticks1 = schedstat_ns(pid), stat_cpu_ticks(pid)
        os.waitpid(pid, 0)
        receipt = self.check_receipt(receipt_path, context, tag="P17", exit_status=0)
        output = (receipt or {}).get("output") or {}
        if size is not None and output.get("bytes_seen") != size:
            self.note("%s: the receipt's output saw %r bytes, expected %d"
                      % (context, output.get("bytes_seen"), size))
        if os.path.getsize(out) > OUTPUT_PIPE:
            self.note("%s: --output grew to %d bytes" % (context, os.path.getsize(out)))
        os.unlink(out)
        self.sweep(context)
        tick = 1000.0 / os.sysconf("SC_CLK_TCK")
        return {"cpu_ms": (cpu1 - cpu0) / 1e6, "whole_ms": cpu1 / 1e6,
                "ticks_ms": (ticks1 - ticks0) * tick}

    def output_cat(self, command, size):
        """The yardstick: `command | cat > file` in the same directory, the
        pipe as large as the supervisor's; cat's user+sys (wait4), in ms."""
        out = os.path.join(self.out, "p17-cat.log")
        read_end, write_end = os.pipe()
        try:
            try:
                import fcntl
                fcntl.fcntl(write_end, F_SETPIPE_SZ, OUTPUT_PIPE)
            except OSError as e:
                self.note("P17: cat's pipe keeps its default size (F_SETPIPE_SZ: %s)" % e.strerror)
            fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                cat = self.spawn([shutil.which("cat")], stdin=read_end, stdout=fd)
                writer = self.spawn(command, stdout=write_end)
            finally:
                os.close(fd)
        finally:
            os.close(read_end)
            os.close(write_end)
        _, _, usage = os.wait4(cat, 0)
        os.waitpid(writer, 0)
        if size is not None and os.path.getsize(out) != size:
            self.note("P17: cat copied %d bytes, expected %d" % (os.path.getsize(out), size))
        os.unlink(out)
        return (usage.ru_utime + usage.ru_stime) * 1000

    # COV --------------------------------------------------------------------------------------

    def cov_suite(self):
        """COV: the test suite's statement coverage of supervisor.py, the
        supervisors it starts included (see the docstring: what is not)."""
        version = self.coverage_version()
        patched = version >= (7, 10, 4)  # `[run] patch`: 7.10.0; its `fork`: 7.10.4
        self.cov_dir = tempfile.mkdtemp(prefix="supervisor-bench-cov-")
        os.chmod(self.cov_dir, 0o1777)  # some tests run processes as nobody
        config = self._write("coverage.ini", coverage_config(self.cov_dir, patched))
        env = dict(self.env, COVERAGE_PROCESS_START=config)
        site, minor = self.venv_site()
        # coverage 7.x keeps a .pth in site-packages that starts it from the
        # environment; only where none does (an old version) is ours added.
        pths = [] if self.coverage_starts(env) else [write_pth(site)]
        self.begin("COV the test suite under coverage %s (%s), a few minutes" % (
            ".".join(map(str, version[:3])),
            "patch = " + COVERAGE_PATCHES if patched else "COVERAGE_PROCESS_START and a .pth"))
        before = file_digest(SUPERVISOR_REAL)
        try:
            self.add_nobody_pths(site, minor, pths)
            code, seconds, summary = self.run_suite(env)
        finally:
            for path in pths:
                os.unlink(path)
        if file_digest(SUPERVISOR_REAL) != before:  # the line numbers would not match
            self.note("COV: supervisor.py changed while the suite ran: its ranges are unreliable")
        data = self.coverage_json(config)
        data["commit"] = git_describe(SUPERVISOR_REAL)
        self.cov_rows(data, version, patched, pths, code, seconds, summary)

    def coverage_version(self):
        """coverage.version_info of the venv's interpreter; refuse without it."""
        if not os.access(VENV_PYTHON, os.X_OK):
            raise BenchError("COV needs the project's venv, %s: python3 -m venv .venv && "
                             ".venv/bin/python -m pip install -r tests/requirements.txt coverage"
                             % VENV_PYTHON)
        done = subprocess.run([VENV_PYTHON, "-c", "import coverage; print(coverage.version_info"
                               "[:3])"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        if done.returncode != 0:
            raise BenchError("COV needs coverage.py in the venv: %s -m pip install coverage"
                             % VENV_PYTHON)
        return tuple(int(x) for x in done.stdout.decode().strip("()\n ").split(","))

    def coverage_starts(self, env):
        """Does the venv's interpreter start coverage from this environment?"""
        done = subprocess.run([VENV_PYTHON, "-c", "import sys; print('coverage' in sys.modules)"],
                              env=env, cwd=self.cov_dir, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL)
        for name in os.listdir(self.cov_dir):  # what that probe saved, if anything
            os.unlink(os.path.join(self.cov_dir, name))
        return done.stdout.strip() == b"True"

    def venv_site(self):
        """(site-packages, "3.11") of the venv's interpreter."""
        done = subprocess.run([VENV_PYTHON, "-c", "import sys, sysconfig; print(sysconfig."
                               "get_paths()['purelib']); print('%d.%d' % sys.version_info[:2])"],
                              stdout=subprocess.PIPE, check=True)
        site, minor = done.stdout.decode().split()
        return site, minor

    def add_nobody_pths(self, site, minor, written):
        """Tests run some supervisors as nobody with a system python3 (the
        venv's interpreter is under /root, out of nobody's reach): where one
        has the venv's minor version, a .pth in its site-packages lets it
        import coverage from the venv's (world-readable) site-packages, only
        when coverage's variables are set. Adds the .pth files to written."""
        seen = set([os.path.realpath(VENV_PYTHON)])
        for python in NOBODY_PYTHONS:
            real = os.path.realpath(python)
            if real in seen or not os.access(real, os.X_OK):
                continue
            seen.add(real)
            done = subprocess.run([real, "-c", "import site, sys; print('%d.%d' % "
                                   "sys.version_info[:2]); print(site.getsitepackages()[0])"],
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            found = done.stdout.decode().split()
            if done.returncode != 0 or len(found) != 2 or found[0] != minor:
                self.note("COV: %s is not Python %s: supervisors it runs are not measured"
                          % (python, minor))
            elif not os.access(found[1], os.W_OK):
                self.note("COV: cannot write to %s: supervisors %s runs are not measured"
                          % (found[1], python))
            else:
                written.append(write_pth(found[1], import_from=site))

    def run_suite(self, env):
        """`.venv/bin/python -m pytest -q` from the project's root, in a session
        of its own (killed as a group if it outlives COVERAGE_SUITE_ABORT or
        the bench is interrupted): (exit code, seconds, pytest's last line
        and the ids of the tests that failed)."""
        log_path = os.path.join(self.tmp, "pytest.log")
        t0 = time.monotonic()
        with open(log_path, "wb") as log:
            suite = subprocess.Popen([VENV_PYTHON, "-m", "pytest", "-q"], cwd=ROOT, env=env,
                                     stdin=subprocess.DEVNULL, stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
            try:
                code = suite.wait(timeout=COVERAGE_SUITE_ABORT)
            except subprocess.TimeoutExpired:
                raise BenchError("COV: the test suite still ran after %g s" % COVERAGE_SUITE_ABORT)
            finally:
                if suite.returncode is None:
                    os.killpg(suite.pid, signal.SIGKILL)  # its leader is our unreaped child
                    suite.wait()
        seconds = time.monotonic() - t0
        lines = [line for line in (read_text(log_path) or "").splitlines() if line.strip()]
        failed = [line.split(" - ")[0] for line in lines if line.startswith(("FAILED ", "ERROR "))]
        return code, seconds, (lines[-1].strip("= ") if lines else "", failed)

    def coverage_json(self, config):
        """Combine the saved data and read coverage's JSON report of
        supervisor.py: its "files" entry."""
        out = os.path.join(self.tmp, "coverage.json")
        for argv in (["combine", "-q"], ["json", "-q", "-o", out, "--include", SUPERVISOR_REAL]):
            done = subprocess.run([VENV_PYTHON, "-m", "coverage"] + argv + ["--rcfile", config],
                                  cwd=self.cov_dir, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT)
            if done.returncode != 0:
                raise BenchError("COV: coverage %s failed: %s" % (
                    argv[0], done.stdout.decode("utf-8", "replace").strip()[-300:]))
        with open(out) as f:
            files = json.load(f)["files"]
        entry = [v for k, v in files.items() if os.path.realpath(k) == SUPERVISOR_REAL]
        if not entry:
            raise BenchError("COV: no data for %s (was anything measured?)" % SUPERVISOR_REAL)
        return entry[0]

    def cov_rows(self, data, version, patched, pths, code, seconds, summary):
        """The COV row, its uncovered ranges (all in the JSON, the first
        COVERAGE_NOTE_RANGES as notes) and what could not be measured."""
        percent = data["summary"]["percent_covered"]
        ranges = uncovered_ranges(SUPERVISOR_REAL, data["executed_lines"], data["missing_lines"])
        missing = len(data["missing_lines"])
        self.add_row("COV", "statements of supervisor.py run by the test suite, subprocesses "
                     "included (%d of %d)" % (data["summary"]["covered_lines"],
                                              data["summary"]["num_statements"]),
                     [percent], "%", ">= %g %%" % COVERAGE_LIMIT, percent, COVERAGE_LIMIT,
                     passed=percent >= COVERAGE_LIMIT,
                     extra={"coverage_version": ".".join(map(str, version[:3])),
                            "supervisor_commit": data["commit"],
                            "mechanism": "patch = " + COVERAGE_PATCHES if patched else
                            "COVERAGE_PROCESS_START and a .pth",
                            "pth_files_added_then_removed": pths, "pytest_exit": code,
                            "pytest_summary": summary[0],
                            "pytest_failed": summary[1],
                            "suite_s": round(seconds, 1), "missing_statements": missing,
                            "missing_lines": data["missing_lines"],
                            "excluded_lines": data.get("excluded_lines", []),
                            "uncovered_ranges": ranges})
        if code != 0:
            self.note("COV: pytest exited %d (%s%s): the coverage is of the tests that ran"
                      % (code, summary[0], "; " + ", ".join(summary[1]) if summary[1] else ""))
        self.note("COV: %d statements never executed, in %d ranges; the first %d:"
                  % (missing, len(ranges), min(COVERAGE_NOTE_RANGES, len(ranges))))
        for r in ranges[:COVERAGE_NOTE_RANGES]:
            self.note("COV:   %s (%s)" % (r["lines"], r["in"]))
        self.note("COV: not measured, so counted as never executed if nothing else runs them: "
                  "supervisors run with -S (no site, no .pth), by another interpreter "
                  "(test_pythons.py), from a copy of the file, or ended by SIGKILL%s" % (
                      "" if patched else "; and, without patch = _exit and execv, every "
                      "supervisor run as a command (it ends with os._exit) and the command's "
                      "setup in its forked child (it ends in an exec)"))
        self.note("COV: suite %.0f s under coverage, with %s" % (seconds, VENV_PYTHON))

    # -- Whole run --------------------------------------------------------------------------

    def check_platform(self):
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        wait_exited(pid)
        readable = read_text("/proc/%d/schedstat" % pid) is not None
        os.waitpid(pid, 0)
        if not readable:
            raise BenchError("a zombie's /proc/PID/schedstat is not readable here; P8 cannot be measured")
        if read_text("/proc/%d/io" % self.me) is None:
            self.note("/proc/PID/io is not readable: no syscall counts in P5/P9")
        set_child_subreaper()

    def run(self, only=None, coverage=False):
        """Every row (only: those groups), quiet host first, the busy host
        (P9) last; P11 comes and goes between the two. COV, which runs the
        whole test suite, only when asked (coverage, or COV in only)."""
        self.check_platform()
        self.set_section("probe")
        self.probe_containments()
        steps = (("P0", self.p0_lean_core), ("P1", self.p1_startup), ("P2", self.p2_exit),
                 ("P3", self.p3_deadline), ("P4", self.p4_stop_file), ("P5", self.p5_idle),
                 ("P6", self.p6_p7_drains), ("P10", self.p10_peak_rss),
                 ("P14", self.p14_receipt_size), ("P15", self.p15_limits),
                 ("P16", self.p16_deadline_stops), ("P17", self.p17_output),
                 ("P18", self.p18_density),
                 ("P12", self.p12_storm),
                 ("P13", self.p13_many_sessions), ("P11", self.p11_crowded_host),
                 ("P9", self.p9_busy_host), ("COV", self.cov_suite))
        for name, step in steps:
            if (name == "COV" and coverage) or (
                    name in only if only is not None else name != "COV"):
                step()

    def read_stderr_log(self):
        """The runs' stderr, section by section: a note with its first lines,
        and the tracebacks counted by their last line and the file of their
        last frame (and why, where the cause is known)."""
        for section, path in self.stderr_logs:
            lines = [line for line in (read_text(path) or "").splitlines() if line.strip()]
            if not lines:
                continue
            known = [why for (where, start), why in sorted(KNOWN_STDERR.items())
                     if where == section and any(x.startswith(start) for x in lines)]
            self.note("stderr of the runs, %s (%d lines), first: %s%s" % (
                section, len(lines), " | ".join(lines[:3]), "".join(sorted(set(known)))))
            errors = {}
            for k, line in enumerate(lines):
                if not line.startswith("Traceback"):
                    continue
                # Its end: the exception's line (other runs' lines may come between).
                ends = [j for j in range(k + 1, len(lines)) if not lines[j].startswith(" ")]
                end = next((j for j in ends if EXCEPTION_LINE.match(lines[j])), ends[0] if ends
                           else None)
                if end is None:
                    continue
                frames = [x.split('"')[1] for x in lines[k + 1:end]
                          if x.startswith('  File "') and x.count('"') >= 2]
                key = (lines[end], os.path.basename(frames[-1]) if frames else "?")
                errors[key] = errors.get(key, 0) + 1
            for (error, where), times in sorted(errors.items()):
                self.note("stderr of the runs, %s: %d traceback(s) ending %s, raised in %s%s" % (
                    section, times, error, where, KNOWN_TRACEBACKS.get((error.split(":")[0], where),
                                                                     "")))

    def cleanup(self):
        """Kill and reap all we started, read the runs' stderr (also after a
        failure: it may say why), remove the temporary directory."""
        try:
            self.stop_loops()
            self.stop_busy_host()
        finally:
            try:
                for pid in self.children() - self.keep:
                    try:
                        os.kill(pid, signal.SIGTERM)  # supervisors drain their trees
                    except ProcessLookupError:
                        pass
                self.sweep("cleanup", expected=True, grace=3.0)
            finally:
                self.read_stderr_log()
                for fd in (self.devnull, self.stderr_fd):
                    os.close(fd)
                shutil.rmtree(self.tmp, ignore_errors=True)
                if self.cov_dir is not None:
                    shutil.rmtree(self.cov_dir, ignore_errors=True)


def code_lines(path):
    """Lines holding a token that is neither a comment nor part of a docstring
    (the first statement of a module, class or function, when a string):
    the count of the project's codelines.py."""
    import ast
    import io
    import tokenize
    with open(path, "rb") as f:
        source = f.read()
    docs = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and body and isinstance(
                body[0], ast.Expr) and isinstance(getattr(body[0].value, "value", None), str):
            docs.update(range(body[0].lineno, body[0].end_lineno + 1))
    skip = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENDMARKER, tokenize.ENCODING)
    code = set()
    for token in tokenize.tokenize(io.BytesIO(source).readline):
        if token.type not in skip:
            code.update(line for line in range(token.start[0], token.end[0] + 1)
                        if line not in docs)
    return len(code)


def declared_version():
    """supervisor.py's __version__, read from the copy the rows run."""
    with open(SUPERVISOR) as f:
        found = re.search(r'^__version__ = "([^"]+)"$', f.read(), re.M)
    return found.group(1) if found else None


def declared_schema():
    """supervisor.py's RECEIPT_SCHEMA_VERSION, read from the file (None if
    it names none)."""
    with open(SUPERVISOR) as f:
        found = re.search(r"^RECEIPT_SCHEMA_VERSION = (\d+)$", f.read(), re.M)
    return int(found.group(1)) if found else None


def file_digest(path):
    import hashlib
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def git_describe(path):
    """The commit of the repository holding path, "+dirty" when path differs
    from it, or None without git."""
    try:
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--", path],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    except OSError:
        return None
    if head.returncode != 0:
        return None
    return head.stdout.decode().strip() + ("+dirty" if dirty.stdout.strip() else "")


def write_pth(directory, import_from=None):
    """A .pth file in directory that starts coverage (its process_startup())
    when coverage's variables are set, and only then, importing it from
    import_from if given; silent if that fails (a test may read stderr).
    Its path: the caller removes it."""
    lines = ["try:",
             " import os",
             " if os.environ.get('COVERAGE_PROCESS_START') or "
             "os.environ.get('COVERAGE_PROCESS_CONFIG'):"]
    if import_from:
        lines.append("  sys.path.append(%r)" % import_from)
    lines += ["  import coverage", "  coverage.process_startup()", "except Exception:", " pass"]
    path = os.path.join(directory, "zz_supervisor_bench_coverage.pth")
    with open(path, "w") as f:
        f.write("import sys; exec(%r)\n" % "\n".join(lines))  # a .pth runs lines starting "import"
    return path


def coverage_config(data_dir, patched):
    """coverage.py's config for COV: every process saves its own data file
    (parallel) in data_dir, and only supervisor.py is measured; with patched,
    coverage's own patches carry the measurement into subprocesses, through
    os._exit (the supervisor's way out), into forked children and up to
    their exec."""
    lines = ["[run]", "parallel = true", "include = %s" % SUPERVISOR_REAL,
             "data_file = %s" % os.path.join(data_dir, ".coverage")]
    if patched:
        lines.append("patch = %s" % COVERAGE_PATCHES)
    return "\n".join(lines) + "\n"


def uncovered_ranges(path, executed, missing):
    """Runs of consecutive never-executed statements (consecutive among the
    statements, as coverage's report merges them), each with the innermost
    function or class it falls in: [{"lines": "120-125", "first", "last",
    "statements", "in"}]."""
    statements = sorted(set(executed) | set(missing))
    missing = set(missing)
    ranges, run = [], []
    for line in statements + [None]:
        if line in missing:
            run.append(line)
        elif run:
            ranges.append(run)
            run = []
    scopes = code_scopes(path)
    return [{"lines": "%d" % r[0] if len(r) == 1 else "%d-%d" % (r[0], r[-1]),
             "first": r[0], "last": r[-1], "statements": len(r), "in": scope_of(scopes, r[0])}
            for r in ranges]


def code_scopes(path):
    """(first line, last line, qualified name) of every function and class."""
    import ast
    with open(path, "rb") as f:
        tree = ast.parse(f.read())
    scopes = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                scopes.append((first, child.end_lineno, name))
                visit(child, name + ".")
            else:
                visit(child, prefix)
    visit(tree, "")
    return scopes


def scope_of(scopes, line):
    """The innermost scope holding line, or "<module>"."""
    inside = [s for s in scopes if s[0] <= line <= s[1]]
    return max(inside, key=lambda s: s[0])[2] if inside else "<module>"


def reference_tools():
    """(name, argv prefix) of GNU timeout and tini where they are on PATH."""
    tools = []
    timeout = shutil.which("timeout")
    if timeout:
        try:
            version = subprocess.run([timeout, "--version"], stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL).stdout.decode()
        except OSError:
            version = ""
        if "GNU coreutils" in version:
            tools.append(("timeout", [timeout, "600"]))
    tini = shutil.which("tini")
    if tini:
        tools.append(("tini", [tini, "-s", "-g", "--"]))
    return tools


# --- Output ----------------------------------------------------------------------------------

def progress(text):
    sys.stderr.write("[%6.1fs] %s\n" % (time.monotonic() - START, text))
    sys.stderr.flush()


def fmt(value, digits=2):
    if value is None:
        return "-"
    if value != value:
        return "nan"
    return "%.*f" % (digits, value)


def table(rows):
    header = ["row", "what", "N", "median", "min", "max", "yardstick", "diff/ratio", "unit",
              "target", "result", "load1"]
    lines = [header]
    for r in rows:
        if r["diff_text"] == "ratio":
            diff = "x%.2f" % r["diff"]
        elif r["diff_text"] == "share":
            diff = "%.0f%%" % (r["diff"] * 100)
        elif r["diff"] is None:
            diff = "-"
        else:
            diff = "%+.2f" % r["diff"]
        load = r.get("load") or {}
        lines.append([r["row"], r["what"], str(r["n"]), fmt(r["median"]), fmt(r["min"]),
                      fmt(r["max"]), fmt(r["yardstick_median"]), diff, r["unit"],
                      r["target"], r["result"],
                      "%s-%s r%s" % (fmt(load.get("load1_min")), fmt(load.get("load1_max")),
                                      fmt(load.get("runnable_median"), 0))])
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    right = set([2, 3, 4, 5, 6, 7])
    out = []
    for k, line in enumerate(lines):
        cells = [cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
                 for i, cell in enumerate(line)]
        out.append("  ".join(cells).rstrip())
        if k == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def machine_info(py, check, how):
    uname = os.uname()
    return {
        "kernel": "%s %s %s" % (uname.sysname, uname.release, uname.machine),
        "uname_r": uname.release,
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),  # what nproc says
        "python": py, "python_version": check["version"], "python_how": how,
        "python_binary": os.path.realpath(py), "python_prefix": check["prefix"],
        "python_base_prefix": check["base_prefix"], "python_site_dirs": check["site_dirs"],
        "python_pth": check["pth"],
        "bench_python_version": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host_processes": sum(1 for name in os.listdir("/proc") if name.isdigit()),
        "loadavg_start": os.getloadavg(),
        "tmp_filesystem": filesystem_of(tempfile.gettempdir()),
        "supervisor": PROJECT_SUPERVISOR, "supervisor_copy": SUPERVISOR,
        "python_environment": dict((k, v) for k, v in os.environ.items() if k.startswith("PYTHON")),
    }


def parse_args(argv):
    parser = argparse.ArgumentParser(description="Measure supervisor.py against P0-P17 "
                                     "(and, when asked, the test suite's coverage of it: COV).")
    parser.add_argument("--python", help="the interpreter to run everything with; its site "
                        "must load no .pth (default: the first such of /usr/bin/python3, "
                        "/usr/local/bin/python3 and this one, else a venv of one of them "
                        "without site-packages, made for the run; pyenv shims are refused)")
    parser.add_argument("--pyz", metavar="PATH", help="treereap.pyz for P0 (it must hold this "
                        "supervisor.py; default: built by scripts/build_pyz.py for the run)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    parser.add_argument("--pairs", type=int, default=None, help="pairs per row (default 30)")
    parser.add_argument("--pairs-big", type=int, default=None,
                        help="pairs for the N=1000 rows, and P12's runs per variant up to 5 "
                        "(default: min(pairs, 12))")
    parser.add_argument("--quick", action="store_true", help="~10 pairs, for development")
    parser.add_argument("--nemo", metavar="PATH", help="NeMo Gym's process_supervisor.py (at "
                        "978ad55), fetched into a temporary folder: P0's, P16's and P18's "
                        "baseline")
    parser.add_argument("--only", help="development: comma-separated groups to run "
                        "(P0,P1,P2,P3,P4,P5,P6 (P6-P8),P10,P14,P15,P16,P17,P18,P12,P13,P11,"
                        "P9,COV); P9 needs "
                        "P4,P5,P6 for its ratios")
    parser.add_argument("--density-n", type=int, default=DENSITY_N, metavar="N",
                        help="P18: supervisors at once (default %d)" % DENSITY_N)
    parser.add_argument("--density-rounds", type=int, default=1, metavar="R",
                        help="P18: rounds of the three ways, the order rotating (default 1)")
    parser.add_argument("--coverage", action="store_true", help="also run COV: the test "
                        "suite under coverage.py (in .venv), supervisor.py's statements it runs")
    args = parser.parse_args(argv)
    if args.pairs is None:
        args.pairs = 10 if args.quick else 30
    if args.pairs_big is None:
        args.pairs_big = min(args.pairs, 4 if args.quick else 12)
    if args.pairs < 1 or args.pairs_big < 1:
        parser.error("--pairs and --pairs-big must be at least 1")
    if args.density_n < 1 or args.density_rounds < 1:
        parser.error("--density-n and --density-rounds must be at least 1")
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if not sys.platform.startswith("linux"):
        sys.stderr.write("bench.py: Linux only\n")
        return 2
    scratch = tempfile.mkdtemp(prefix="supervisor-bench-python-")
    try:
        return measure(args, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def measure(args, scratch):
    """Choose the interpreter, take the copy of supervisor.py every row runs,
    run the bench, print (and write) the results."""
    global SUPERVISOR
    SUPERVISOR = os.path.join(scratch, "src", "supervisor.py")
    os.mkdir(os.path.dirname(SUPERVISOR))
    shutil.copyfile(PROJECT_SUPERVISOR, SUPERVISOR)
    commit_at_start = git_describe(SUPERVISOR_REAL)
    try:
        py, check, how = choose_python(args.python, scratch)
        for name in ("nemo", "pyz"):
            if getattr(args, name) and not os.path.isfile(getattr(args, name)):
                raise BenchError("--%s %s: no such file" % (name, getattr(args, name)))
    except BenchError as e:
        sys.stderr.write("bench.py: %s\n" % e)
        return 2
    progress("interpreter: %s (Python %s), %s" % (py, check["version"], how))

    def interrupted(signum, frame):
        raise KeyboardInterrupt()
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupted)

    info = machine_info(py, check, how)
    bench = Bench(py, args.pairs, args.pairs_big, args.quick, args.nemo, args.pyz, scratch)
    bench.python_check = check
    bench.density_n, bench.density_rounds = args.density_n, args.density_rounds
    error, status = None, 0
    gc.disable()  # no collector pauses inside the bench's own timings
    try:
        bench.run(set(args.only.upper().split(",")) if args.only else None, args.coverage)
    except KeyboardInterrupt:
        error, status = "interrupted", 130
    except BenchError as e:
        error, status = str(e), 2
    finally:
        bench.cleanup()
    wall = time.monotonic() - START
    info["loadavg_end"] = os.getloadavg()
    info["pyz_build"] = getattr(bench, "pyz_build", None)
    info["supervisor_commit"] = commit_at_start
    info["supervisor_sha256"] = file_digest(SUPERVISOR)
    info["supervisor_code_lines"] = code_lines(SUPERVISOR)
    info["supervisor_version"] = declared_version()
    if file_digest(PROJECT_SUPERVISOR) != info["supervisor_sha256"]:
        bench.note("supervisor.py changed during the run (now %s): every row ran the copy taken "
                   "at the start (%s, sha256 %s...)" % (git_describe(SUPERVISOR_REAL),
                                                        commit_at_start,
                                                        info["supervisor_sha256"][:12]))
    print("supervisor.py %s (%s) benchmark: %s, %d CPUs (nproc %d), %d processes on the host, "
          "load %s at the start, %s at the end"
          % (info["supervisor_version"], info["supervisor_commit"], info["kernel"],
             info["cpu_count"], info["cpus_usable"],
             info["host_processes"], " ".join("%.2f" % x for x in info["loadavg_start"]),
             " ".join("%.2f" % x for x in info["loadavg_end"])))
    print("interpreter: %s, Python %s, %s" % (py, check["version"], how))
    print("pairs %d (N=1000 rows: %d); times in ms unless the unit says otherwise; load1: the "
          "1-minute load average while the row ran (min-max), rN: the median number of runnable "
          "tasks then (the bench's own included)\n" % (args.pairs, args.pairs_big))
    if bench.rows:
        print(table(bench.rows))
    for text in bench.notes:
        print("note: " + text)
    print("\ntotal wall time %.1f s" % wall)
    if error:
        sys.stderr.write("bench.py: %s\n" % error)
    if args.json:
        document = {"machine": info, "settings": {"pairs": args.pairs, "pairs_big": args.pairs_big,
                                                  "quick": args.quick, "grace_s": GRACE,
                                                  "idle_window_s": bench.window},
                    "rows": bench.rows, "notes": bench.notes, "error": error, "wall_s": wall}
        with open(args.json, "w") as f:
            json.dump(document, f, indent=2)
            f.write("\n")
    if status:
        return status
    return 1 if any(r["result"] == "MISS" for r in bench.rows) else 0


START = time.monotonic()

if __name__ == "__main__":
    sys.exit(main())
