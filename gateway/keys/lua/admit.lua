-- KEYS: one per check. ARGV: per check four values: kind, a, b, c (after prelude.lua: now_us, rate_*, bucket_*).
--   rate    a = interval_us, b = burst        GCRA: b requests back to back from idle, then one per interval
--   tokens  a = capacity per minute, b = reserve  token bucket; the reservation is settled later (release.lua)
--   slots   a = maximum, b = lease id, c = lease_us   leases in a sorted set scored by expiry
--   count   a = limit, b = amount, c = ttl_ms     a counter that must stay <= limit (videos per day)
--   budget  a = limit, b = field ('cost'|'tokens'), c = wait_us   refused once the hash's field reaches a
-- All checks pass and are taken together, or nothing is taken: returns {1} or {0, wait_us, index of the check}.
local now = now_us()
local checks = #KEYS
local levels = {}
for i = 1, checks do
  local kind, a, b, c = ARGV[i * 4 - 3], ARGV[i * 4 - 2], ARGV[i * 4 - 1], ARGV[i * 4]
  local wait = 0
  if kind == 'rate' then
    wait = rate_wait(KEYS[i], now, (math.max(tonumber(b), 1) - 1) * tonumber(a))
  elseif kind == 'tokens' then
    local capacity = tonumber(a)
    levels[i] = bucket_level(KEYS[i], capacity, now)
    wait = math.ceil((tonumber(b) - levels[i]) * 60000000 / capacity)
  elseif kind == 'slots' then
    redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', string.format('%d', now))
    if redis.call('ZCARD', KEYS[i]) >= tonumber(a) then wait = 1000000 end
  elseif kind == 'count' then
    if tonumber(redis.call('GET', KEYS[i]) or '0') + tonumber(b) > tonumber(a) then wait = tonumber(c) * 1000 end
  elseif kind == 'budget' then
    if tonumber(redis.call('HGET', KEYS[i], b) or '0') >= tonumber(a) then wait = tonumber(c) end
  end
  if wait > 0 then return {0, wait, i} end
end
for i = 1, checks do
  local kind, a, b, c = ARGV[i * 4 - 3], ARGV[i * 4 - 2], ARGV[i * 4 - 1], ARGV[i * 4]
  if kind == 'rate' then
    rate_take(KEYS[i], now, tonumber(a))
  elseif kind == 'tokens' then
    bucket_store(KEYS[i], tonumber(a), levels[i] - tonumber(b), now)
  elseif kind == 'slots' then
    redis.call('ZADD', KEYS[i], string.format('%d', now + tonumber(c)), b)
    redis.call('PEXPIRE', KEYS[i], math.ceil(tonumber(c) / 1000) + 1000)
  elseif kind == 'count' then
    redis.call('INCRBY', KEYS[i], b)
    redis.call('PEXPIRE', KEYS[i], c)
  end
end
return {1}
