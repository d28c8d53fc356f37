-- KEYS: slots. ARGV: lease, lease_us. Returns 0 when the lease is gone (expired, or Redis lost it), else 1.
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
local lease_us = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], 'XX', string.format('%d', now_us() + lease_us), ARGV[1])
redis.call('PEXPIRE', KEYS[1], math.ceil(lease_us / 1000) + 1000)
return 1
