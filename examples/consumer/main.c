/* examples/consumer/main.c: one attention call on the ref device, checked by hand.
 * Two tokens, one head of size 2, no weights (Q = K = V = x), scale 1:
 *   x0 = (1, 0), x1 = (0, 1): scores of query 0 are (1, 0), so its weights are
 *   (e, 1) / (e + 1) and its output is (e, 1) / (e + 1); query 1 mirrors it. */
#include <clattn.h>

#include <math.h>
#include <stdio.h>

int main(void)
{
    printf("clattn %s (header %d.%d.%d)\n", clattn_version(), CLATTN_VERSION_MAJOR, CLATTN_VERSION_MINOR,
           CLATTN_VERSION_PATCH);
    clattn_device *dev = NULL;
    clattn_status st = clattn_device_open("ref", &dev);
    if (st != CLATTN_STATUS_SUCCESS) {
        fprintf(stderr, "device: %s: %s\n", clattn_status_string(st), clattn_last_error());
        return 1;
    }
    clattn_attention_desc d = {.batch = 1, .seq_q = 2, .embed = 2, .heads = 1, .scale = 1.0f};
    clattn_plan *plan = NULL;
    st = clattn_plan_create(dev, &d, NULL, &plan);
    if (st != CLATTN_STATUS_SUCCESS) {
        fprintf(stderr, "plan: %s: %s\n", clattn_status_string(st), clattn_last_error());
        clattn_device_free(dev);
        return 1;
    }
    const float x[4] = {1, 0, 0, 1};
    float out[4] = {NAN, NAN, NAN, NAN};
    clattn_attention_args a = {.x = x, .x_count = 4, .out = out, .out_count = 4};
    st = clattn_plan_execute(plan, &a);
    clattn_plan_free(plan);
    clattn_device_free(dev);
    if (st != CLATTN_STATUS_SUCCESS) {
        fprintf(stderr, "execute: %s: %s\n", clattn_status_string(st), clattn_last_error());
        return 1;
    }
    const double e = exp(1.0), hi = e / (e + 1), lo = 1 / (e + 1);
    const double want[4] = {hi, lo, lo, hi};
    for (int i = 0; i < 4; i++)
        if (!(fabs(out[i] - want[i]) <= 1e-6)) {
            fprintf(stderr, "out[%d] = %g, expected %g\n", i, out[i], want[i]);
            return 1;
        }
    printf("consumer: ok\n");
    return 0;
}
