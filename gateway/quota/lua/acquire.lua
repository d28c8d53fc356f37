-- KEYS: rate, slots, tokens. ARGV: lease, interval_us, max_concurrent, lease_us, tokens_per_minute (0: off), reserved.
-- Returns {1, now} when admitted, else {0, wait_us, reason} having taken nothing.
local now = now_us()
if redis.call('ZSCORE', KEYS[2], ARGV[1]) then return {1, now} end  -- a retried call that already got in
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', string.format('%d', now))  -- leases of crashed holders
local full = redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[3])
local wait, reason = rate_wait(KEYS[1], now), 'rate'
local capacity, reserved = tonumber(ARGV[5]), tonumber(ARGV[6])
local level = 0
if capacity > 0 then
  level = bucket_level(KEYS[3], capacity, now)
  local shortfall = math.ceil((reserved - level) * 60000000 / capacity)
  if shortfall > wait then wait, reason = shortfall, 'tokens' end
end
if full then return {0, math.max(wait, 0), 'concurrency'} end
if wait > 0 then return {0, wait, reason} end
local lease_us = tonumber(ARGV[4])
rate_take(KEYS[1], now, tonumber(ARGV[2]))
redis.call('ZADD', KEYS[2], string.format('%d', now + lease_us), ARGV[1])
redis.call('PEXPIRE', KEYS[2], math.ceil(lease_us / 1000) + 1000)
if capacity > 0 then bucket_store(KEYS[3], capacity, level - reserved, now) end
return {1, now}
