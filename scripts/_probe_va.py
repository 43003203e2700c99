from replayfmt.cuda import check, driver

cu = driver()
ctx = check(cu.cuDevicePrimaryCtxRetain(check(cu.cuDeviceGet(0), "dev")), "ctx")
check(cu.cuCtxSetCurrent(ctx), "ctx")
for size, align, hint in [
    (1 << 21, 1 << 21, 0x600000000000),
    (1 << 22, 1 << 21, 0x600000000000),
    (1 << 24, 1 << 21, 0x600000000000),
    (1 << 30, 1 << 21, 0x600000000000),
    (1 << 22, 0, 0x600000000000),
    (1 << 22, 1 << 21, 0x610000000000),
]:
    err, p = cu.cuMemAddressReserve(size, align, hint, 0)
    print(size, align, hex(hint), err, hex(int(p)), int(p) == hint)
    if int(p):
        cu.cuMemAddressFree(p, size)
