/*
 * power_policy.c - SPANK plugin: the --power-policy=NAME job option of pbs_power.
 *
 * sbatch, salloc and srun accept --power-policy=NAME. The name is checked
 * here (letters, digits and . _ : + -, at most POLICY_MAXLEN characters) so
 * that a typo fails at submission, not at job start. The value is put in the
 * job control environment with spank_job_control_setenv(), which Slurm hands
 * to PrologSlurmctld / EpilogSlurmctld as SPANK_POWER_POLICY; the
 * pbs-power-slurm-prolog program reads it there. Whether the policy exists in
 * the topology is checked by the prolog, which knows the topology.
 *
 * Build: make -C slurm_spank (needs <slurm/spank.h>: Debian libslurm-dev).
 * Install on login nodes (sbatch/salloc/srun) and compute nodes (slurmstepd
 * loads every plugin listed), one line in plugstack.conf:
 *
 *     optional /usr/local/lib/slurm/power_policy.so
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <slurm/spank.h>

SPANK_PLUGIN(power_policy, 1);

#define POLICY_MAXLEN 64
#define CONTROL_VAR "POWER_POLICY" /* reaches the prolog as SPANK_POWER_POLICY */

static char policy[POLICY_MAXLEN + 1];

static int valid_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '.' || c == '_' || c == ':' || c == '+' || c == '-';
}

/* 0 when name is a well-formed policy name, else -1 with the reason in why. */
static int check_name(const char *name, const char **why)
{
    size_t n;

    if (name == NULL || name[0] == '\0') {
        *why = "is empty";
        return -1;
    }
    n = strlen(name);
    if (n > POLICY_MAXLEN) {
        *why = "is longer than 64 characters";
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        if (!valid_char(name[i])) {
            *why = "may hold only letters, digits and . _ : + -";
            return -1;
        }
    }
    return 0;
}

/* Option callback: validate and remember the name (remote: already checked). */
static int power_policy_opt(int val, const char *optarg, int remote)
{
    const char *why = "";

    (void) val;
    if (check_name(optarg, &why) != 0) {
        if (!remote)
            slurm_error("--power-policy: \"%s\" %s", optarg ? optarg : "", why);
        return -1;
    }
    snprintf(policy, sizeof(policy), "%s", optarg);
    return 0;
}

static struct spank_option power_policy_option = {
    "power-policy", "NAME",
    "Run the job's nodes under the power policy NAME (pbs_power; default: the "
    "job comment's power_policy=NAME, the partition's default, else the topology's).",
    1, 0, power_policy_opt
};

int slurm_spank_init(spank_t sp, int ac, char **av)
{
    spank_context_t ctx = spank_context();
    spank_err_t rc;

    (void) ac;
    (void) av;
    if (ctx != S_CTX_ALLOCATOR && ctx != S_CTX_LOCAL && ctx != S_CTX_REMOTE)
        return 0;
    rc = spank_option_register(sp, &power_policy_option);
    if (rc != ESPANK_SUCCESS) {
        slurm_error("power_policy: cannot register --power-policy: %s", spank_strerror(rc));
        return -1;
    }
    return 0;
}

/* After option processing in sbatch/salloc/srun: pass the name to the prolog. */
int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
    spank_context_t ctx = spank_context();
    spank_err_t rc;

    (void) ac;
    (void) av;
    if (policy[0] == '\0' || (ctx != S_CTX_ALLOCATOR && ctx != S_CTX_LOCAL))
        return 0;
    rc = spank_job_control_setenv(sp, CONTROL_VAR, policy, 1);
    if (rc != ESPANK_SUCCESS) {
        slurm_error("--power-policy: cannot pass %s to the job: %s", policy,
                    spank_strerror(rc));
        return -1;
    }
    return 0;
}
