-- KEYS: slots, tokens, the lease's settled mark. ARGV: lease, tokens_per_minute (0: off), token correction,
-- only_if_held (1: a cleanup). The mark makes the correction happen once: redis-py runs the script again
-- when its reply was lost (a timeout or a reset after it ran), and the lease may have expired meanwhile.
-- Returns 1 when the lease was held, else 0.
local held = redis.call('ZREM', KEYS[1], ARGV[1])
local capacity, correction = tonumber(ARGV[2]), tonumber(ARGV[3])
if (held == 1 or ARGV[4] == '0') and capacity > 0 and correction ~= 0
    and redis.call('SET', KEYS[3], '1', 'NX', 'PX', 60000) then
  local now = now_us()
  bucket_store(KEYS[2], capacity, math.min(capacity, bucket_level(KEYS[2], capacity, now) - correction), now)
end
return held
