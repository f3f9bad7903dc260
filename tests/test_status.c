/* test_status.c: every status has a message; OpenCL and CLBlast codes are recognised. */
#include "testutil.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

Test(status, own_codes_have_distinct_messages)
{
    const int codes[] = {CLATTN_STATUS_SUCCESS, CLATTN_STATUS_INVALID_ARGUMENT, CLATTN_STATUS_SHAPE_MISMATCH,
                         CLATTN_STATUS_SIZE_OVERFLOW, CLATTN_STATUS_TOO_LARGE_FOR_DEVICE,
                         CLATTN_STATUS_OUT_OF_HOST_MEMORY, CLATTN_STATUS_DEVICE_ALLOCATION,
                         CLATTN_STATUS_BUILD_FAILURE, CLATTN_STATUS_UNSUPPORTED, CLATTN_STATUS_NO_DEVICE,
                         CLATTN_STATUS_INVALID_DEVICE_SPEC};
    const size_t n = sizeof codes / sizeof codes[0];
    for (size_t i = 0; i < n; i++) {
        const char *s = clattn_status_string(codes[i]);
        cr_assert(s && *s && !strstr(s, "unknown"), "code %d: '%s'", codes[i], s);
        for (size_t j = 0; j < i; j++) cr_assert_str_neq(s, clattn_status_string(codes[j]));
    }
}

Test(status, passthrough_codes)
{
    cr_assert_str_eq(clattn_status_string(-4), "CL_MEM_OBJECT_ALLOCATION_FAILURE");
    cr_assert_str_eq(clattn_status_string(-11), "CL_BUILD_PROGRAM_FAILURE");
    cr_assert_str_eq(clattn_status_string(-54), "CL_INVALID_WORK_GROUP_SIZE");
    cr_assert(strstr(clattn_status_string(-1017), "CLBlast"));
    cr_assert(strstr(clattn_status_string(-2045), "half precision"));
    cr_assert(strstr(clattn_status_string(-999), "OpenCL error"));
    cr_assert(strstr(clattn_status_string(-1500), "CLBlast error"));
    cr_assert_str_eq(clattn_status_string(12345), "unknown status");
}

Test(status, last_error_is_per_call)
{
    clattn_device *dev = NULL;
    cr_assert_eq(clattn_device_open("bogus", &dev), CLATTN_STATUS_INVALID_DEVICE_SPEC);
    cr_assert(strstr(clattn_last_error(), "bogus"));
    cr_assert_eq(clattn_device_open("ref", &dev), CLATTN_STATUS_SUCCESS);
    cr_assert_str_eq(clattn_last_error(), "", "a successful call clears the detail");
    clattn_device_free(dev);
}

Test(version, matches_the_header)
{
    char want[64];
    snprintf(want, sizeof want, "%d.%d.%d", CLATTN_VERSION_MAJOR, CLATTN_VERSION_MINOR, CLATTN_VERSION_PATCH);
    cr_assert_str_eq(clattn_version(), want);
}
