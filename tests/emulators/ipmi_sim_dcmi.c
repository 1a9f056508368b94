/*
 * DCMI power limiting for ipmi_sim, the OpenIPMI BMC simulator (tests only).
 *
 * ipmi_sim answers the DCMI group extension (netfn 0x2c, group 0xdc) with
 * "invalid command" (0xc1). Loaded into one simulated BMC with a lan.conf
 * line
 *
 *     loadlib "/path/ipmi_sim_dcmi.so" "state=/path/dcmi.state min=50 max=2000"
 *
 * it answers Get Power Limit (0x03), Set Power Limit (0x04) and
 * Activate/Deactivate Power Limit (0x05) as the DCMI 1.5 specification lays
 * them out, refuses limits outside [min, max] watts with completion code
 * 0x84, and after every change writes the limit to the state file as one
 * line "active=A limit=W correction=MS sample=S action=X", so that tests can
 * check what the BMC holds without asking it through ipmitool.
 *
 * Build: gcc -shared -fPIC -o ipmi_sim_dcmi.so ipmi_sim_dcmi.c
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <OpenIPMI/serv.h>
#include <OpenIPMI/mcserv.h>

#define DCMI_GROUP 0xdc
#define CMD_GET_LIMIT 0x03
#define CMD_SET_LIMIT 0x04
#define CMD_ACTIVATE 0x05
#define CC_NO_ACTIVE_LIMIT 0x80
#define CC_LIMIT_OUT_OF_RANGE 0x84
#define CC_INVALID_CMD 0xc1
#define CC_BAD_LENGTH 0xc7
#define CC_INVALID_FIELD 0xcc

struct power_limit {
    int active;
    unsigned int limit;       /* watts */
    unsigned long correction; /* milliseconds */
    unsigned int sample;      /* seconds */
    unsigned int action;      /* exception action */
};

static struct power_limit plimit = { 0, 0, 1000, 1, 0 };
static unsigned int min_watts = 1, max_watts = 65535;
static char state_path[4096];

static void save_state(void)
{
    FILE *f;
    char tmp[4200];

    if (!state_path[0])
        return;
    snprintf(tmp, sizeof(tmp), "%s.tmp", state_path);
    f = fopen(tmp, "w");
    if (!f)
        return;
    fprintf(f, "active=%d limit=%u correction=%lu sample=%u action=%u\n",
            plimit.active, plimit.limit, plimit.correction, plimit.sample,
            plimit.action);
    fclose(f);
    rename(tmp, state_path);
}

static void put16(unsigned char *p, unsigned int v)
{
    p[0] = v & 0xff;
    p[1] = (v >> 8) & 0xff;
}

static unsigned int get16(const unsigned char *p)
{
    return p[0] | (p[1] << 8);
}

static void answer(unsigned char *rdata, unsigned int *rdata_len,
                   unsigned char cc)
{
    rdata[0] = cc;
    rdata[1] = DCMI_GROUP;
    *rdata_len = 2;
}

static void get_limit(unsigned char *rdata, unsigned int *rdata_len)
{
    memset(rdata, 0, 15);
    rdata[0] = plimit.active ? 0 : CC_NO_ACTIVE_LIMIT;
    rdata[1] = DCMI_GROUP;
    rdata[4] = plimit.action;
    put16(rdata + 5, plimit.limit);
    put16(rdata + 7, plimit.correction & 0xffff);
    put16(rdata + 9, (plimit.correction >> 16) & 0xffff);
    put16(rdata + 13, plimit.sample);
    *rdata_len = 15;
}

static void set_limit(msg_t *msg, unsigned char *rdata,
                      unsigned int *rdata_len)
{
    unsigned int watts;

    if (msg->len < 15) {
        answer(rdata, rdata_len, CC_BAD_LENGTH);
        return;
    }
    watts = get16(msg->data + 5);
    if (watts < min_watts || watts > max_watts) {
        answer(rdata, rdata_len, CC_LIMIT_OUT_OF_RANGE);
        return;
    }
    plimit.action = msg->data[4];
    plimit.limit = watts;
    plimit.correction = get16(msg->data + 7)
        | ((unsigned long) get16(msg->data + 9) << 16);
    plimit.sample = get16(msg->data + 13);
    save_state();
    answer(rdata, rdata_len, 0);
}

static void activate(msg_t *msg, unsigned char *rdata,
                     unsigned int *rdata_len)
{
    if (msg->len < 2) {
        answer(rdata, rdata_len, CC_BAD_LENGTH);
        return;
    }
    if (msg->data[1] > 1) {
        answer(rdata, rdata_len, CC_INVALID_FIELD);
        return;
    }
    plimit.active = msg->data[1];
    save_state();
    answer(rdata, rdata_len, 0);
}

static void handle_dcmi(lmc_data_t *mc, msg_t *msg, unsigned char *rdata,
                        unsigned int *rdata_len, void *cb_data)
{
    (void) mc;
    (void) cb_data;
    switch (msg->cmd) {
    case CMD_GET_LIMIT:
        get_limit(rdata, rdata_len);
        break;
    case CMD_SET_LIMIT:
        set_limit(msg, rdata, rdata_len);
        break;
    case CMD_ACTIVATE:
        activate(msg, rdata, rdata_len);
        break;
    default:
        answer(rdata, rdata_len, CC_INVALID_CMD);
        break;
    }
}

static void parse_options(const char *options)
{
    char buf[4096], *tok, *save = NULL;

    if (!options)
        return;
    snprintf(buf, sizeof(buf), "%s", options);
    for (tok = strtok_r(buf, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
        if (strncmp(tok, "state=", 6) == 0)
            snprintf(state_path, sizeof(state_path), "%s", tok + 6);
        else if (strncmp(tok, "min=", 4) == 0)
            min_watts = (unsigned int) strtoul(tok + 4, NULL, 0);
        else if (strncmp(tok, "max=", 4) == 0)
            max_watts = (unsigned int) strtoul(tok + 4, NULL, 0);
    }
}

int ipmi_sim_module_print_version(sys_data_t *sys, char *options)
{
    (void) sys;
    (void) options;
    printf("ipmi_sim_dcmi: DCMI power limiting for tests\n");
    return 0;
}

int ipmi_sim_module_init(sys_data_t *sys, const char *options)
{
    (void) sys;
    parse_options(options);
    save_state();
    ipmi_emu_register_group_extension_handler(DCMI_GROUP, handle_dcmi, NULL);
    return 0;
}
